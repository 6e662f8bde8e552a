"""controller/attach.py, the one attach transport (a warm claim uses a Channel once): a session's attach kept from
run to run, reused while open and recent, replaced when the other side closed it or it sat idle, dropped when a
read broke, closed with the session."""
from coderun_operator.controller.attach import IDLE_SECONDS, Channel
from fake_k8s import FakeK8s

POD = "s1-session-uid"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def frame_for(document: bytes) -> bytes:
    return b"\nCODERUN-RESULT-V1 {\"n\":\"" + document + b"\"}\n"


def until_frame(received: bytes) -> bool:
    return received.endswith(b"}\n")


def make(answer=frame_for):
    api, clock, attached = FakeK8s(), Clock(), []
    api.attach_answers[POD] = answer
    attach = api.attach
    api.attach = lambda *args: attached.append(attach(*args)) or attached[-1]
    return Channel(api, "ns", POD, clock), clock, attached


def test_runs_share_one_attach_while_it_is_open_and_recent():
    channel, clock, attached = make()
    for word in (b"a", b"b", b"c"):
        clock.now += IDLE_SECONDS / 2
        assert channel.exchange(word, until_frame, 5) == (True, frame_for(word))
    assert len(attached) == 1 and not attached[0].closed


def test_an_attach_the_other_side_closed_or_left_idle_is_replaced_before_a_document_goes():
    channel, clock, attached = make()
    channel.exchange(b"a", until_frame, 5)
    attached[0].closed = True  # the API server ended the stream between runs
    assert channel.exchange(b"b", until_frame, 5) == (True, frame_for(b"b"))
    assert len(attached) == 2
    clock.now += IDLE_SECONDS + 1
    channel.close_if_idle()  # the tick lets it go
    assert attached[1].closed
    assert channel.exchange(b"c", until_frame, 5)[0] and len(attached) == 3


def test_a_read_that_ended_without_the_frame_is_never_reused():
    channel, _, attached = make(lambda document: b"half a fra")
    assert channel.exchange(b"a", until_frame, 5) == (True, b"half a fra")
    assert attached[0].closed
    channel.exchange(b"b", until_frame, 5)
    assert len(attached) == 2


def test_an_attach_that_fails_sends_nothing_and_the_next_run_tries_again():
    channel, _, attached = make(ConnectionError("unreachable"))
    assert channel.exchange(b"a", until_frame, 5) == (False, b"")
    channel.api.attach_answers[POD] = frame_for
    assert channel.exchange(b"b", until_frame, 5) == (True, frame_for(b"b"))


def test_closed_with_its_session_it_takes_no_more_documents():
    channel, _, attached = make()
    channel.exchange(b"a", until_frame, 5)
    channel.close()
    assert attached[0].closed
    assert channel.exchange(b"b", until_frame, 5) == (False, b"")
    assert len(attached) == 1


def test_closed_during_a_run_it_closes_as_that_run_ends():
    holder = {}

    def answer(document):
        holder["channel"].close()  # the session ends while the run is in the sandbox
        assert not holder["attached"][0].closed  # its run still reads its frame
        return frame_for(document)
    channel, _, attached = make(answer)
    holder.update(channel=channel, attached=attached)
    assert channel.exchange(b"a", until_frame, 5) == (True, frame_for(b"a"))
    assert attached[0].closed


def test_a_second_exchange_while_one_is_on_sends_nothing():
    """One run at a time: a second document (a race the queue should never let through) is refused unsent
    rather than share the stream, where each read could take the other's bytes."""
    holder = {}

    def answer(document):
        holder["second"] = holder["channel"].exchange(b"b", until_frame, 5)
        return frame_for(document)
    channel, _, attached = make(answer)
    holder["channel"] = channel
    assert channel.exchange(b"a", until_frame, 5) == (True, frame_for(b"a"))
    assert holder["second"] == (False, b"") and len(attached) == 1


def test_an_attach_read_keeps_no_copy_of_what_it_read():
    """The kubernetes client's WSClient keeps everything it reads in `_all` too (capture_all, always on for
    `stream`): on an attach a session keeps for all its runs that copy would grow with every run's output."""
    import io
    from coderun_operator.k8s import Attached

    class Socket:  # the parts of WSClient read_until uses, keeping a copy as it does
        def __init__(self, frames):
            self.frames, self.channel, self._all = list(frames), b"", io.BytesIO()

        def is_open(self):
            return True

        def update(self, timeout):
            if self.frames:
                data = self.frames.pop(0)
                self.channel += data
                self._all.write(data)

        def read_stdout(self, timeout=0):
            data, self.channel = self.channel, b""
            return data

        def read_all(self):
            out, self._all, self.channel = self._all.getvalue(), io.BytesIO(), b""
            return out

    socket = Socket([b"x" * 1000 for _ in range(5)] + [b"}\n"])
    assert Attached(socket).read_until(until_frame, 1 << 20, 5).endswith(b"}\n")
    assert socket._all.getvalue() == b""
