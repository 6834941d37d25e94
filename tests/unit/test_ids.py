import os
import signal
import time
import uuid

from stalwart import ids
from stalwart.ids import uuid7, uuid7s


def test_uuid7_has_version_and_variant():
    value = uuid7()
    assert value.version == 7
    assert value.variant == uuid.RFC_4122


def test_uuid7_sorts_by_creation_millisecond():
    values = [uuid7() for _ in range(2000)]
    milliseconds = [value.int >> 80 for value in values]
    assert milliseconds == sorted(milliseconds)
    assert len(set(values)) == len(values)


def test_uuid7_made_back_to_back_keep_their_order():
    values = [uuid7() for _ in range(5000)]
    assert values == sorted(values)
    assert len(set(values)) == len(values)
    assert {value.version for value in values} == {7}
    assert {value.variant for value in values} == {uuid.RFC_4122}


def test_ids_made_together_follow_each_other_and_those_made_one_by_one():
    before = uuid7()
    together = uuid7s(5000)  # one millisecond for all: each steps on from the last
    after = uuid7()
    values = [before, *together, after]
    assert values == sorted(values)
    assert len(set(values)) == len(values)
    assert {value.version for value in together} == {7}
    assert {value.variant for value in together} == {uuid.RFC_4122}
    assert uuid7s(0) == []


def test_a_child_forked_while_an_id_is_being_made_can_make_ids():
    """A fork taken while another thread is inside uuid7() must not leave the child stuck
    on a lock that nobody in the child will ever release."""
    held = ids._sequence._lock
    held.acquire()  # as if another thread were making an id at the moment of the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 once it has an id; the parent kills it if stuck
            try:
                os._exit(0 if uuid7().version == 7 else 1)
            finally:
                os._exit(2)
    finally:
        held.release()
    deadline = time.monotonic() + 10
    status = None
    while status is None and time.monotonic() < deadline:
        done, status_code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = status_code
        else:
            time.sleep(0.01)  # polling the child's exit, with a deadline
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child could not make an id within 10 s")
    assert os.waitstatus_to_exitcode(status) == 0
