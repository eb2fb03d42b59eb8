"""Units every layer shares. Times are ``time.perf_counter_ns()`` integers; figures in seconds."""

NS = 1_000_000_000  # nanoseconds a second
