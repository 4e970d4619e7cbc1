"""Run by tests/test_mutate.py in a warm worker (not collected by default: its name does not start with test_): the
capture stream SGLang's compile phase publishes inside `set_pcg_capture_stream`, and which copy was imported."""


def test_the_capture_stream_is_published_inside_the_session():
    from sglang.srt.compilation import compile_phase

    print(f"compile_phase imported from {compile_phase.__file__}")
    stream = object()
    assert compile_phase.get_pcg_capture_stream() is None  # at rest on import
    with compile_phase.set_pcg_capture_stream(stream):
        assert compile_phase.get_pcg_capture_stream() is stream, "the capture stream is not set inside the session"
    assert compile_phase.get_pcg_capture_stream() is None
