"""Requests that differ across ranks: every rank raises CollectiveMismatchError
naming the tensor, the field and the ranks that differ, and the next
collective works; a failed handle raises its error again."""
import numpy as np

import commlib
from _common import check_equal, done, expect_raises

commlib.init()
r, n = commlib.rank(), commlib.size()
odd = r == n - 1  # the last rank disagrees


def after_error_still_works(tag):
    got = commlib.allreduce(np.full(3, r + 1.0), op=commlib.Sum, name=f"ok.{tag}")
    check_equal(got, np.full(3, n * (n + 1) / 2.0), f"allreduce after {tag}")


cases = {
    "shape": (lambda: commlib.allreduce(np.ones(5 if odd else 4), name="t.shape"),
              ["'t.shape'", "shape", f"rank {n - 1}: [5]", "[4]"]),
    "dtype": (lambda: commlib.allreduce(np.ones(4, np.float64 if odd else np.float32), name="t.dtype"),
              ["'t.dtype'", "dtype", f"rank {n - 1}: float64", "float32"]),
    "op": (lambda: commlib.allreduce(np.ones(4), op=commlib.Max if odd else commlib.Sum, name="t.op"),
           ["'t.op'", "reduction op", f"rank {n - 1}: Max", "Sum"]),
    "prescale": (lambda: commlib.allreduce(np.ones(4), prescale_factor=2.0 if odd else 1.0, name="t.pre"),
                 ["'t.pre'", "prescale_factor", f"rank {n - 1}: 2"]),
    "postscale": (lambda: commlib.allreduce(np.ones(4), postscale_factor=0.5 if odd else 1.0, name="t.post"),
                  ["'t.post'", "postscale_factor", f"rank {n - 1}: 0.5"]),
    "root": (lambda: commlib.broadcast(np.ones(4), root_rank=1 if odd else 0, name="t.root"),
             ["'t.root'", "root rank", f"rank {n - 1}: 1"]),
    "operation": (lambda: (commlib.broadcast(np.ones(4), 0, name="t.kind") if odd
                           else commlib.allreduce(np.ones(4), name="t.kind")),
                  ["'t.kind'", "collective operation", f"rank {n - 1}: broadcast", "allreduce"]),
    "allgather-trailing": (lambda: commlib.allgather(np.ones((2, 3 if odd else 2)), name="t.ag"),
                           ["'t.ag'", "shape", f"rank {n - 1}: [2, 3]"]),
    "reducescatter": (lambda: commlib.reducescatter(np.ones((n + 1 if odd else n, 2)), name="t.rs"),
                      ["'t.rs'", "shape"]),
    "alltoall-dtype": (lambda: commlib.alltoall(np.ones(n, np.int32 if odd else np.int64), name="t.a2a"),
                       ["'t.a2a'", "dtype", "int32", "int64"]),
}

for tag, (fn, fragments) in cases.items():
    err = expect_raises(commlib.CollectiveMismatchError, fn, f"mismatch {tag}")
    for frag in fragments:
        if frag not in str(err):
            from _common import fail
            fail(f"mismatch {tag}: message lacks {frag!r}: {err}")
    after_error_still_works(tag)

# A failed handle raises its error at every synchronize (a caller that keeps
# it, like a delayed average, never takes it for a result); a completed one
# refuses a second synchronize.
h = commlib.allreduce_async(np.ones(5 if odd else 4), name="t.again")
first = expect_raises(commlib.CollectiveMismatchError, lambda: commlib.synchronize(h),
                      "async mismatch")
again = expect_raises(commlib.CollectiveMismatchError, lambda: commlib.synchronize(h),
                      "second synchronize of a failed handle")
if again is not first:
    from _common import fail
    fail(f"the second synchronize raised another error: {again!r}")
h = commlib.allreduce_async(np.ones(4), name="t.once")
commlib.synchronize(h)
expect_raises(ValueError, lambda: commlib.synchronize(h), "second synchronize",
              "already been synchronized")
after_error_still_works("async")

# A blocking in-place call that repeats the last one on its array word for
# word is submitted again and waited for without a Handle (ops.allreduce_'s
# quick way): its error is raised there too. The last rank calls the name on
# another array, of another shape (its checked way).
x = np.ones(4)
for k in range(2):
    check_equal(commlib.allreduce_(x, name="t.repeat", op=commlib.Sum), np.full(4, float(n ** (k + 1))),
                f"repeated allreduce_ {k}")
y = np.ones(5) if odd else x
expect_raises(commlib.CollectiveMismatchError, lambda: commlib.allreduce_(y, name="t.repeat", op=commlib.Sum),
              "mismatch of a repeated allreduce_", "'t.repeat'")
after_error_still_works("repeat")

# The same name may be reused once the failed request is gone.
check_equal(commlib.allreduce(np.ones(4), name="t.shape", op=commlib.Sum), np.full(4, float(n)),
            "reusing a failed name")
done()
