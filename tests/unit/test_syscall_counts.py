"""The syscall-count tool's parsing of strace output (``ratchet.bench.syscalls``)."""

from ratchet.bench.syscalls import count_calls, thread_label


def test_counts_each_call_once_and_skips_signals_and_exits(tmp_path):
    trace = tmp_path / "t.42"
    trace.write_text(
        'getpid()                                = 21157\n'
        ' > /usr/lib/libc.so.6(__getpid+0x7) [0xd54e7]\n'
        'epoll_pwait(39, [], 1024, 5000, NULL, 8) = 0\n'
        'read(46, "\\1\\0", 8)         = 8\n'
        '--- SIGPIPE {si_signo=SIGPIPE} ---\n'
        'getpid()                                = 21157\n'
        '+++ exited with 0 +++\n')
    assert count_calls(trace) == {"getpid": 2, "epoll_pwait": 1, "read": 1}


def test_the_main_thread_is_told_apart_from_threads_that_share_its_name():
    names = {10: "python", 11: "python", 12: "rdk:main"}
    assert thread_label(10, 10, names) == "main (loop)"
    assert thread_label(11, 10, names) == "python (other)"
    assert thread_label(12, 10, names) == "rdk:main"
