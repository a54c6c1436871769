"""One submission route (parsed, nothing run): the C API takes every request
as one ``commlib_request`` through ``commlib_submit`` (and the blocking
point-to-point form); in Python only commlib/submit.py fills that struct and
calls those entries; argument checks that several paths make (the 0-d
tensor to a collective along dimension 0) are written once, in commlib/."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = (ROOT / "csrc" / "include" / "commlib" / "c_api.h").read_text()
PY_SOURCES = {p: p.read_text() for d in ("commlib", "frontends") for p in sorted((ROOT / d).rglob("*.py"))}


def _declarations() -> dict[str, str]:
    """C API function name -> its parameter list."""
    text = re.sub(r"/\*.*?\*/", "", HEADER, flags=re.S)
    return {m.group(1): " ".join(m.group(2).split())
            for m in re.finditer(r"\b(commlib_\w+)\s*\(([^)]*)\)\s*;", text)}


def test_the_c_api_submits_through_one_request_struct():
    decls = _declarations()
    assert decls["commlib_submit"] == "const commlib_request* req"
    assert decls["commlib_p2p_blocking"] == "const commlib_request* req, double timeout_s"
    # (a refused call's abort names its collective by the same struct)
    assert decls["commlib_abort"] == "const commlib_request* req, const char* why"
    # nothing else takes a request, or a request's fields one by one
    takers = sorted(n for n, params in decls.items() if "commlib_request" in params)
    assert takers == ["commlib_abort", "commlib_p2p_blocking", "commlib_submit"], takers
    fieldwise = sorted(n for n, params in decls.items()
                       if "op_type" in params or ("reduce_op" in params and "prescale" in params))
    assert not fieldwise, fieldwise


def test_only_commlib_submit_fills_and_submits_requests():
    fills = sorted(str(p.relative_to(ROOT)) for p, text in PY_SOURCES.items()
                   if re.search(r"commlib_request\s*\*", text))
    assert fills == ["commlib/submit.py"], fills
    calls = sorted(str(p.relative_to(ROOT)) for p, text in PY_SOURCES.items()
                   if re.search(r"\blib\.commlib_(submit|p2p_blocking|abort|enqueue)\w*", text))
    assert calls == ["commlib/submit.py"], calls


def test_the_0d_check_is_written_once():
    where = sorted(str(p.relative_to(ROOT)) for p, text in PY_SOURCES.items()
                   if re.search(r"needs (a tensor|tensors|\{.*?\}) with at least ", text))
    assert where == ["commlib/checks.py"], where
