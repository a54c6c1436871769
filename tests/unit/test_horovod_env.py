"""Horovod's environment variables read as commlib's (commlib.horovod_env)."""
from commlib import config
from commlib.horovod_env import ALIASES, NO_STALL_CHECK, apply, commlib_values


def test_every_alias_names_a_variable_of_the_core():
    assert set(ALIASES.values()) <= set(config.names())
    config.check("COMMLIB_STALL_CHECK_TIME", NO_STALL_CHECK)


def test_horovod_values_fill_only_unset_commlib_variables():
    env = {"HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "2.5",
           "HOROVOD_CACHE_CAPACITY": "8", "COMMLIB_CACHE_CAPACITY": "16",
           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
           "COMMLIB_CYCLE_TIME": ""}
    assert commlib_values(env) == {"COMMLIB_FUSION_THRESHOLD": "1048576",
                                   "COMMLIB_CYCLE_TIME": "2.5"}
    apply(env)
    assert env["COMMLIB_FUSION_THRESHOLD"] == "1048576" and env["COMMLIB_CACHE_CAPACITY"] == "16"


def test_dynamic_timeline_and_disabled_stall_check():
    assert commlib_values({"HOROVOD_TIMELINE": "DYNAMIC"}) == {}
    assert commlib_values({"HOROVOD_TIMELINE": "/tmp/t.json"}) == {"COMMLIB_TIMELINE": "/tmp/t.json"}
    both = {"HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "5"}
    assert commlib_values(both) == {"COMMLIB_STALL_CHECK_TIME": NO_STALL_CHECK}
    assert commlib_values({"HOROVOD_STALL_CHECK_DISABLE": "0"}) == {}
    assert commlib_values({"HOROVOD_STALL_CHECK_DISABLE": "1", "COMMLIB_STALL_CHECK_TIME": "7"}) == {}


def test_an_error_names_the_horovod_variable_it_was_read_from(monkeypatch):
    from commlib import horovod_env
    monkeypatch.setattr(horovod_env, "_read_from", {})
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "abc")
    monkeypatch.setenv("COMMLIB_FUSION_THRESHOLD", "")
    monkeypatch.setenv("COMMLIB_CYCLE_TIME", "2")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "9")  # (not read: COMMLIB_CYCLE_TIME is set)
    apply()
    msg = horovod_env.explain("COMMLIB_FUSION_THRESHOLD='abc': not a number")
    assert msg == "COMMLIB_FUSION_THRESHOLD='abc': not a number (read from HOROVOD_FUSION_THRESHOLD='abc')"
    assert horovod_env.explain("COMMLIB_CYCLE_TIME='x': not a number") == "COMMLIB_CYCLE_TIME='x': not a number"
