"""Framed messages on a pipe: several per read, long ones over several reads, the writer's end."""

import os
import select
import threading
from multiprocessing.connection import Connection

import pytest

from fastload._loading.wire.frames import FrameReader, send_frame

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pipe():
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


def read_next(reader, timeout=10.0):
    """Poll and fill until a whole message is there (as the pool and the workers do)."""
    poller = select.poll()
    poller.register(reader.fd, select.POLLIN)
    while True:
        message = reader.pending()
        if message is not None:
            return message
        assert poller.poll(int(timeout * 1000)), "no message within the timeout"
        reader.fill()


def test_several_messages_in_one_read_come_out_one_by_one(pipe):
    read_fd, write_fd = pipe
    messages = [b"", b"a", b"xyz" * 100, bytes(range(256))]
    for message in messages:
        send_frame(write_fd, message)
    reader = FrameReader(read_fd)
    reader.fill()  # all of them, in one read
    got = [reader.pending() for _ in messages]
    assert got == messages
    assert reader.pending() is None and not reader.has_leftover


def test_a_message_longer_than_the_pipe_arrives_whole(pipe):
    read_fd, write_fd = pipe
    big = os.urandom(3 << 20)  # far more than a pipe holds: the writer blocks part way
    writer = threading.Thread(target=lambda: (send_frame(write_fd, big), send_frame(write_fd, b"next")))
    writer.start()
    reader = FrameReader(read_fd)
    assert read_next(reader) == big
    assert read_next(reader) == b"next"
    writer.join(10)
    assert not writer.is_alive()


def test_a_partial_message_is_not_handed_out(pipe):
    read_fd, write_fd = pipe
    os.write(write_fd, (10).to_bytes(4, "big") + b"12345")
    reader = FrameReader(read_fd)
    reader.fill()
    assert reader.pending() is None and reader.has_leftover
    os.write(write_fd, b"67890")
    assert read_next(reader) == b"1234567890"


def test_the_writer_closing_its_end_raises_eof(pipe):
    read_fd, write_fd = pipe
    send_frame(write_fd, b"last")
    os.close(write_fd)
    reader = FrameReader(read_fd)
    assert read_next(reader) == b"last"
    with pytest.raises(EOFError):
        reader.fill()


def test_frames_are_the_framing_of_multiprocessing_connections(pipe):
    read_fd, write_fd = pipe
    send_frame(write_fd, b"to a Connection")
    connection = Connection(os.dup(read_fd), writable=False)
    try:
        assert connection.recv_bytes() == b"to a Connection"
    finally:
        connection.close()


def test_holds_finds_a_whole_message_among_those_read_but_not_taken(pipe):
    read_fd, write_fd = pipe
    reader = FrameReader(read_fd)
    assert not reader.holds(b"stop")
    for message in (b"task-1", b"task-2", b"stop"):
        send_frame(write_fd, message)
    reader.fill()
    assert reader.holds(b"stop") and reader.holds(b"task-2")
    assert not reader.holds(b"sto") and not reader.holds(b"task")
    assert reader.pending() == b"task-1"
    assert reader.holds(b"stop")
    assert reader.pending() == b"task-2" and reader.pending() == b"stop"
    assert not reader.holds(b"stop")


def test_holds_ignores_a_message_not_read_whole(pipe):
    read_fd, write_fd = pipe
    reader = FrameReader(read_fd)
    frame = (4).to_bytes(4, "big") + b"st"  # "stop", cut short
    os.write(write_fd, frame)
    reader.fill()
    assert not reader.holds(b"stop") and not reader.holds(b"st")
    os.write(write_fd, b"op")
    reader.fill()
    assert reader.holds(b"stop")
