"""Replay harnesses: the search strategies and planners played against measured traces, with
no daemon and no emulator (for tests, benchmarks and algorithm work). Kept out of the
installed `powerd` package on purpose: the daemon never imports them.

    training   strategies over a training (or batch-size-1 inference) trace, budget sweeps
    inference  the inference and interleave planners over (mode, batch size) traces
"""
