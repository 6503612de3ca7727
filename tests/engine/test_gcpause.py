"""engine.gcpause: start-up imports with the collector paused, in hetsim's own processes only,
once per process; what they created is frozen and collection resumes."""
import json
import subprocess
import sys

from helpers import REPO

PROBE = """
import gc, json
from engine.gcpause import imports_without_gc, own_process

kept = []

def block(make):
    frozen_before = gc.get_freeze_count()
    with imports_without_gc():
        enabled = gc.isenabled()
        kept.append([[i] for i in range(make)])  # long-lived objects, as imports create
    return {"enabled_inside": enabled, "enabled_after": gc.isenabled(),
            "newly_frozen": gc.get_freeze_count() - frozen_before}

out = {"not_owned": block(1000)}
own_process()
out["first"] = block(200_000)
out["again"] = block(1000)
print(json.dumps(out))
"""


def probe(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_only_an_owned_process_pauses_the_collector_once_and_freezes_what_its_imports_made():
    out = probe(PROBE)
    # a library user's process: untouched
    assert out["not_owned"] == {"enabled_inside": True, "enabled_after": True, "newly_frozen": 0}
    # hetsim's own: paused inside, frozen (the 200k lists and their ints among them), resumed
    first = out["first"]
    assert first["enabled_inside"] is False and first["enabled_after"] is True
    assert first["newly_frozen"] > 200_000
    # once per process: a run's later objects are never frozen
    assert out["again"] == {"enabled_inside": True, "enabled_after": True, "newly_frozen": 0}


def test_a_collector_the_user_turned_off_stays_off():
    out = probe("""
import gc, json
from engine.gcpause import imports_without_gc, own_process
own_process()
gc.disable()
with imports_without_gc():
    pass
print(json.dumps([gc.isenabled(), gc.get_freeze_count()]))
""")
    assert out == [False, 0]
