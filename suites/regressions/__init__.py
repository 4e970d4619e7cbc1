"""Pinned regressions: explicit cases of known bugs (see each module's docstring), run by the gate and by
`bisect --test` to find the commit that broke them."""
