"""Point-to-point on every rank, checked against numpy: every dtype and size
(eager and rendezvous), unknown shapes, tags out of order, FIFO per tag,
simultaneous exchange, 1000 outstanding isends, a receive posted before its
send, messages to the rank itself, interleaving with collectives and process sets, and the error paths
that raise before or while a message moves."""
from __future__ import annotations

import time

import numpy as np

import commlib
from _common import check_equal, done, expect_raises, fail
from coll_common import DTYPES, make_input

commlib.init()
me, n = commlib.rank(), commlib.size()
right, left = (me + 1) % n, (me - 1) % n
# Sizes around the eager limit (64 KiB) and beyond: header-carried and rendezvous messages.
SHAPES = [(), (0,), (1,), (7, 3), (1000,), (70000,), (600, 1000)]


def payload(src: int, dtype, shape, tag="") -> np.ndarray:
    return make_input(src, dtype, shape, kind="int", tag=f"p2p{tag}")


def every_dtype_and_shape():
    for dt in DTYPES:
        for shape in SHAPES:
            if shape == (600, 1000) and dt.itemsize < 4:
                continue  # (time: the large case once per item size is enough)
            want = payload(left, dt, shape)
            got = commlib.sendrecv(payload(me, dt, shape), dst=right, src=left)
            check_equal(got, want, f"sendrecv {dt} {shape} (unknown shape)")
            out = np.zeros(shape, dtype=dt)
            got = commlib.sendrecv(payload(me, dt, shape), dst=right, src=left, out=out)
            if got is not out:
                fail("sendrecv with out did not return out")
            check_equal(out, want, f"sendrecv {dt} {shape} into out")


def variable_shapes():
    rng = np.random.default_rng(1234)
    for i in range(30):
        rows = [int(x) for x in rng.integers(0, 300, size=n)]
        mine = np.full((rows[me], 5), me * 100 + i, dtype=np.float32)
        got = commlib.sendrecv(mine, dst=right, src=left, send_tag=i, recv_tag=i)
        check_equal(got, np.full((rows[left], 5), left * 100 + i, dtype=np.float32), f"variable shape {i}")


def tags_out_of_order_and_fifo():
    if me == 0:
        hs = [commlib.isend(np.array([tag, k]), dst=1, tag=tag)  # three messages per tag, in order
              for tag in (1, 2, 3) for k in range(3)]
    if me == 1:
        for tag in (3, 1, 2):
            for k in range(3):
                check_equal(commlib.recv(src=0, tag=tag), np.array([tag, k]), f"tag {tag} message {k}")
    if me == 0:
        for h in hs:
            commlib.synchronize(h)
    commlib.barrier()


def simultaneous_exchange():
    for shape in [(10,), (300000,)]:
        hs = [commlib.isend(np.full(shape, me, dtype=np.int64), dst=p, tag=5) for p in range(n) if p != me]
        for p in range(n):
            if p != me:
                check_equal(commlib.recv(src=p, tag=5), np.full(shape, p, dtype=np.int64), f"exchange {shape} from {p}")
        for h in hs:
            commlib.synchronize(h)


def to_itself():
    """A rank's messages to itself: header-carried, read in one copy, split
    between two copiers, and a sendrecv with itself (these once hung: no
    shared-memory lane leads to the rank itself, and MPI was not polled)."""
    for size in (3, 70000, 600000):
        h = commlib.isend(np.full(size, me, dtype=np.float32), dst=me, tag=13)
        check_equal(commlib.recv(src=me, tag=13), np.full(size, me, dtype=np.float32), f"to itself ({size})")
        commlib.synchronize(h)
    got = commlib.sendrecv(np.arange(5) + me, dst=me, src=me, send_tag=14, recv_tag=14)
    check_equal(got, np.arange(5) + me, "sendrecv with itself")


def many_outstanding_isends():
    hs = [commlib.isend(np.array([me, i], dtype=np.int32), dst=right, tag=9) for i in range(1000)]
    for i in range(1000):
        check_equal(commlib.recv(src=left, tag=9), np.array([left, i], dtype=np.int32), f"isend {i}")
    for h in hs:
        commlib.synchronize(h)


def mixed_sizes_in_order():
    """Messages carried with their header (4 KiB) and read in one copy
    (280 KiB) on one tag, 300 outstanding: one host's control lane fills and
    wraps many times and messages wait for room; one tag stays FIFO."""
    sizes = [70000 if i % 3 == 0 else 1024 for i in range(300)]
    hs = [commlib.isend(np.full(s, i, dtype=np.float32), dst=right, tag=12) for i, s in enumerate(sizes)]
    for i, s in enumerate(sizes):
        check_equal(commlib.recv(src=left, tag=12), np.full(s, i, dtype=np.float32), f"message {i} of 300")
    for h in hs:
        commlib.synchronize(h)


def receive_posted_first():
    h = commlib.irecv(src=left, tag=11, out=np.zeros(100000, dtype=np.float64))
    commlib.barrier()
    time.sleep(0.05)
    commlib.send(np.full(100000, float(me)), dst=right, tag=11)
    check_equal(commlib.synchronize(h), np.full(100000, float(left)), "receive posted before its send")


def interleaved_with_collectives():
    even = commlib.add_process_set(list(range(0, n, 2)))
    for i in range(20):
        h = commlib.irecv(src=left, tag=20 + i)
        s = commlib.isend(np.full(50000 if i % 2 else 3, i, dtype=np.float32), dst=right, tag=20 + i)
        total = commlib.allreduce(np.full(4, me, dtype=np.float64), op=commlib.Sum, name=f"mix.{i}")
        check_equal(total, np.full(4, float(sum(range(n)))), f"allreduce {i}")
        if even.included():
            sub = commlib.allreduce(np.ones(3), op=commlib.Sum, process_set=even, name=f"mix.even.{i}")
            check_equal(sub, np.full(3, float(even.size())), f"set allreduce {i}")
            if even.size() > 1:  # point-to-point inside the set, by job ranks
                members = list(range(0, n, 2))
                pos = members.index(me)
                nxt, prv = members[(pos + 1) % len(members)], members[pos - 1]
                got = commlib.sendrecv(np.array([me, i]), dst=nxt, src=prv, process_set=even)
                check_equal(got, np.array([prv, i]), f"set sendrecv {i}")
        check_equal(commlib.synchronize(h), np.full(50000 if i % 2 else 3, i, dtype=np.float32), f"p2p {i}")
        commlib.synchronize(s)
    commlib.remove_process_set(even)


def errors():
    expect_raises(ValueError, lambda: commlib.send(np.ones(2), dst=n), "dst outside the job", "outside the job")
    expect_raises(ValueError, lambda: commlib.recv(src=-1), "negative src", "outside the job")
    expect_raises(ValueError, lambda: commlib.send(np.ones(2), dst=right, tag=-1), "negative tag", "tag")
    expect_raises(TypeError, lambda: commlib.send(np.ones(2), dst=1.5), "float dst", "int")
    expect_raises(TypeError, lambda: commlib.send(np.ones(2, dtype=np.complex64), dst=right), "complex", "dtype")
    expect_raises(ValueError, lambda: commlib.recv(src=left, out=np.ones((4, 4))[:, 1]), "strided out",
                  "contiguous")
    solo = commlib.add_process_set([0])
    if me != 0:
        expect_raises(ValueError, lambda: commlib.send(np.ones(2), dst=0, process_set=solo),
                      "non-member", "not a member")
    else:
        expect_raises(ValueError, lambda: commlib.send(np.ones(2), dst=1, process_set=solo),
                      "peer outside the set", "not a member")
    commlib.remove_process_set(solo)
    # A receive whose out has the wrong size or dtype: both sides raise.
    for shape, dtype in [((3,), np.float32), ((4,), np.int32), ((2, 3), np.float32)]:
        s = commlib.isend(np.ones((2, 2), dtype=np.float32), dst=right, tag=40)
        e = expect_raises(ValueError, lambda: commlib.recv(src=left, tag=40, out=np.zeros(shape, dtype=dtype)),
                          f"recv into {dtype.__name__} {shape}", "the message is float32 [2, 2]")
        want = f"out is {np.dtype(dtype).name} {list(shape)}"
        if want not in str(e):
            fail(f"recv error does not name out's dtype and shape ({want}): {e}")
        expect_raises(ValueError, lambda: commlib.synchronize(s), "the sender of a refused message",
                      f"send to rank {right}")
    # The same message into a right-sized out of another shape works.
    s = commlib.isend(np.arange(6, dtype=np.float32).reshape(2, 3), dst=right, tag=41)
    got = commlib.recv(src=left, tag=41, out=np.zeros(6, dtype=np.float32))
    check_equal(got, np.arange(6, dtype=np.float32), "recv into a flat out of the same size")
    commlib.synchronize(s)


every_dtype_and_shape()
variable_shapes()
tags_out_of_order_and_fifo()
simultaneous_exchange()
to_itself()
many_outstanding_isends()
mixed_sizes_in_order()
receive_posted_first()
interleaved_with_collectives()
errors()
commlib.barrier()
done()
