"""simbridge/console.py: a console survives its reader leaving, and says so once."""
import io
import os

from simbridge.console import Console


def test_a_pipe_whose_reader_left_is_taken_as_gone_once_and_later_lines_are_dropped():
    r, w = os.pipe()
    stream = os.fdopen(w, "w")
    gone = []
    console = Console(stream, on_gone=lambda: gone.append(1))
    print("read", file=console, flush=True)
    assert os.read(r, 100) == b"read\n"
    os.close(r)   # `| head` has read its lines and left
    for _ in range(3):
        print("nobody reads this", file=console, flush=True)   # BrokenPipeError before
    assert console.gone and gone == [1]
    # the descriptor now leads to /dev/null: the interpreter's flush at exit, or a child process
    # that inherited it, writes without the broken pipe
    assert os.write(stream.fileno(), b"x") == 1
    stream.write("buffered")
    stream.flush()
    stream.close()


def test_a_stream_that_is_no_file_keeps_its_lines_and_a_closed_one_is_gone():
    buf = io.StringIO()
    console = Console(buf)
    print("kept", file=console, flush=True)
    assert buf.getvalue() == "kept\n" and not console.gone
    buf.close()
    print("after close", file=console, flush=True)   # ValueError before
    assert console.gone
