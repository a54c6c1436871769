"""commlib.pipeline.timeline without MPI: a wait for a message counts as
point-to-point cost only from the moment its sender finished posting it
(before that it is the peer still computing), postings and the final wait
for the sends count whole; encode/decode round-trip; a timeline missing the
sender's rank is an error, not a silent zero."""
import pytest

from commlib.pipeline import timeline


def two_rank_timelines():
    # rank 0: F0 for 10 s, posts its send at 10..11, waits for the gradient
    # from 11 to 30 (rank 1 posts it at 28: 2 s of that wait moved the message)
    r0 = [("POST", -1, -1, 0.0, 0.5), ("F", 0, 0, 0.5, 10.0), ("SEND_F", 0, 0, 10.0, 11.0),
          ("RECV_B", 0, 0, 11.0, 30.0), ("B", 0, 0, 30.0, 40.0), ("FINISH", -1, -1, 40.0, 40.25)]
    # rank 1: waits for the activation from 0 to 12 (sent at 11: 1 s moving),
    # computes, posts the gradient at 27..28
    r1 = [("POST", -1, -1, 0.0, 0.25), ("RECV_F", 1, 0, 0.25, 12.0), ("F", 1, 0, 12.0, 20.0),
          ("B", 1, 0, 20.0, 27.0), ("SEND_B", 1, 0, 27.0, 28.0), ("FINISH", -1, -1, 28.0, 29.0)]
    return [r0, r1]


def test_waits_before_the_send_are_the_peer_not_the_transport():
    r0, r1 = timeline.p2p_seconds(two_rank_timelines())
    assert r0["compute"] == pytest.approx(19.5)
    assert r0["calls"] == pytest.approx(0.5 + 1.0 + 19.0 + 0.25)
    assert r0["peer_wait"] == pytest.approx(28.0 - 11.0)
    assert r0["p2p"] == pytest.approx(0.5 + 1.0 + 2.0 + 0.25)
    assert r0["step"] == pytest.approx(40.25)
    assert r1["peer_wait"] == pytest.approx(11.0 - 0.25)
    assert r1["p2p"] == pytest.approx(0.25 + 1.0 + 1.0 + 1.0)
    assert r1["step"] == pytest.approx(29.0)


def test_a_message_already_there_is_all_transport():
    r0, r1 = two_rank_timelines()
    r1[1] = ("RECV_F", 1, 0, 11.5, 12.0)  # rank 1 arrives after the send was posted
    assert timeline.p2p_seconds([r0, r1])[1]["peer_wait"] == 0.0


def test_encode_decode_round_trip():
    events = two_rank_timelines()[1]
    rows = timeline.encode(events)
    assert all(len(r) == 5 and all(isinstance(v, float) for v in r) for r in rows)
    assert timeline.decode(rows) == events


def test_missing_sender_timeline_is_an_error():
    r0, r1 = two_rank_timelines()
    with pytest.raises(ValueError, match=r"rank 1: RECV_F\(stage 1, microbatch 0\) has no send"):
        timeline.p2p_seconds([[], r1])
    with pytest.raises(ValueError, match=r"rank 0: RECV_B\(stage 0, microbatch 0\) has no send"):
        timeline.p2p_seconds([r0, []])
    idle = timeline.p2p_seconds([[("F", 0, 0, 0.0, 1.0)], []])[1]  # a rank that ran nothing
    assert idle == {"step": 0.0, "compute": 0.0, "calls": 0.0, "p2p": 0.0, "peer_wait": 0.0}
