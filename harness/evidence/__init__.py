"""Evidence a maintainer can act on, gathered after a run for its failing examples (PyTorch's compile bug template
asks for both): a `TORCH_TRACE` structured trace rendered by `tlparse` (`trace`), and an ablation naming the
smallest setting that still fails (`ablate`). Each re-runs the failure's own replay command in a fresh process;
`settings` is what such a process applies before the suites run."""
