"""The keeper's side of preemption, pure: the running jobs built from grants and the admin's
limits, the requeued attempt's claim on its notice's place, which blocked jobs preempt
(reservations, busy preemptors, shapes once, bounded calls), the grants' terms, the records'
``resumes``, the exemption in the limits, the sync's ``preempted`` end, the agents' word for
a drained victim, the view's reasons and counter, the three settings; and the pass's cost at
25,000 hosts with 1,000 waiting (hypertf.keeper.preempter)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import cast

import pytest

from hypertf.config.inventory import load_inventory
from hypertf.core.admission import (
    PREEMPTING,
    PRIORITY,
    REQUEUED,
    RESOURCES,
    USER_LIMIT,
    Decision,
    Waiting,
)
from hypertf.core.errors import InventoryError
from hypertf.core.grants import GrantTerms, grant_to_json, terms_of_grant
from hypertf.core.jobtransitions import preempted
from hypertf.core.limits import UserLimit, UserLimits
from hypertf.core.matrix import DRAINING, FREE, Held, Matrix
from hypertf.core.placement import Request, expand_hosts
from hypertf.core.preemptnotice import Notice
from hypertf.core.requestcheck import InvalidRequest, waiting_from_record
from hypertf.core.scheduler import Placement, TaskSlot
from hypertf.keeper.admitter import view_of
from hypertf.keeper.preempter import (
    Preempter,
    PreemptSettings,
    choose,
    claim_orders,
    jobs_in,
    running_jobs,
)
from hypertf.store import Store

NOW = 100_000.0
HOSTS = ("h1", "h2")


def key(name: str, user: str) -> str:
    return f"20260101-000000-{name}.{user}"


def job(name: str, user: str = "alice", priority: int = 5, gpus: int = 2, order: int = 100,
        resumes: str = "", hosts: tuple[str, ...] = HOSTS) -> Waiting:
    return Waiting(key(name, user), Request((TaskSlot("worker", 0, gpus),), hosts), priority,
                   order, resumes=resumes)


def held(**cells: tuple[int, ...]) -> Held:
    return Held(dict(cells), {})


def blocked(*jobs: Waiting, reason: str = RESOURCES) -> list[Decision]:
    return [Decision(j.task_key, i, reason) for i, j in enumerate(jobs, start=1)]


def notice(victim: str, by: str = key("p", "alice"), order: int = 7, count: int = 1,
           at: float = NOW) -> Notice:
    return Notice(victim, by, at, at + 120, "priority", order, count)


# -- running jobs, from grants ------------------------------------------------------------
def test_running_jobs_come_from_grants_their_terms_and_the_admins_limits() -> None:
    grants = {key("a", "bob"): held(h1=(0, 1)), key("b", "bob"): held(h2=(0,)),
              key("c", "carol"): held(h2=(1,)), key("d", "dave"): held(),
              key("e", "erin"): held(h1=(2,))}
    terms = {key("a", "bob"): GrantTerms(9, 1, 2, frozenset({"x"})),
             key("c", "carol"): GrantTerms(3, 2)}
    limits = UserLimits(users={"bob": UserLimit(max_priority=4),
                               "carol": UserLimit(no_preempt_ok=True)})
    found = {r.task_key: r for r in running_jobs(grants, {key("a", "bob"): NOW - 50}, terms,
                                                 limits, {key("e", "erin")}, NOW)}
    assert set(found) == {key("a", "bob"), key("b", "bob"), key("c", "carol")}  # no GPUs,
    a, b, c = found[key("a", "bob")], found[key("b", "bob")], found[key("c", "carol")]
    assert (a.priority, a.started, a.preemptions, a.displaced) == (4, NOW - 50, 2, {"x"})
    assert (b.priority, b.started, b.preemptible) == (4, NOW, True)  # no terms: the maximum
    assert (c.priority, c.preemptible) == (3, False)  # exempt by the admin alone


# -- the requeued attempt's place -----------------------------------------------------------
def test_a_resumed_attempt_gets_its_notices_order_and_nothing_else_does() -> None:
    victim = key("v", "bob")
    notices = {victim: notice(victim, order=7)}
    mine = job("r", "bob", 0, order=500, resumes=victim)
    later = job("s", "bob", 0, order=600, resumes=victim)  # a second claim: the first wins
    thief = job("t", "carol", 0, order=400, resumes=victim)  # another user's attempt
    stranger = job("u", "bob", 0, order=450, resumes=key("never", "bob"))  # no notice
    plain = job("w", "dave", 0, order=300)
    out, claims = claim_orders([plain, stranger, thief, later, mine], notices, (), ())
    assert claims == {mine.task_key: victim}
    assert [w.order for w in out] == [300, 450, 400, 600, 7]
    # the victim's grant still lives: nobody resumes it yet; an admitted claim holds it
    assert claim_orders([mine], notices, (), {victim})[1] == {}
    assert claim_orders([mine], notices, {victim}, ())[1] == {}
    assert claim_orders([mine], {}, (), ())[1] == {}


def test_the_grant_keeps_the_terms_the_next_keeper_reads() -> None:
    terms = GrantTerms(5, 123, 2, frozenset({"bob", "carol"}), key("v", "bob"))
    data = grant_to_json(key("r", "bob"), [Placement("worker", 0, "h1", (0,))], {"worker:0": 1},
                         NOW, terms)
    assert terms_of_grant(data) == terms
    assert terms_of_grant(grant_to_json(key("r", "bob"), [], {}, NOW)) is None  # older keeper
    for damaged in ({"priority": "5", "order": 1}, {"priority": 5, "order": -1},
                    {"priority": 5, "order": 1, "displaced": "bob"},
                    {"priority": 5, "order": 1, "resumes": "../x"}, [1]):
        payload = json.loads(data)
        payload["terms"] = damaged
        assert terms_of_grant(json.dumps(payload).encode()) is None


def test_the_preempters_terms_carry_count_displaced_and_claim() -> None:
    preempter = Preempter(cast(Store, None), PreemptSettings(on=True))
    victim = key("v", "bob")
    preempter.notices = {victim: notice(victim, order=7, count=3)}
    preempter.carried = {victim: frozenset({"carol"})}
    preempter.displacing = {key("r", "bob"): frozenset({"erin"})}
    [requeued] = preempter.requeue([job("r", "bob", 0, order=900, resumes=victim)], ())
    assert preempter.terms_for(requeued) == GrantTerms(0, 7, 3, frozenset({"carol", "erin"}),
                                                       victim)
    assert preempter.reasons(blocked(requeued)) == {requeued.task_key: REQUEUED}
    preempter.admitted(requeued.task_key, preempter.terms_for(requeued))
    assert preempter.resumed == {victim: requeued.task_key}
    assert key("r", "bob") not in preempter.displacing
    # the grant gone and the next attempt admitted: the notice is served (nothing to delete
    # while the grant lives); a day-old one goes too
    assert preempter.forced({victim: held(h1=(0,))}, NOW + 121) == {victim}
    assert preempter.forced({victim: held(h1=(0,))}, NOW + 119) == set()
    assert preempter.forced({}, NOW + 121) == set()


# -- who preempts ---------------------------------------------------------------------------
def matrix_of(grants: dict[str, Held], sizes: dict[str, int]) -> Matrix:
    rows: dict[str, list[int | str]] = {h: [FREE] * n for h, n in sizes.items()}
    for k, h in grants.items():
        for host, cells in h.gpus.items():
            for i in cells:
                rows[host][i] = k
    return Matrix(rows)


FULL = {key("a", "bob"): held(h1=(0, 1)), key("b", "bob"): held(h2=(0, 1))}


def running(grants: dict[str, Held] = FULL, tier: int = 0) -> list:
    return running_jobs(grants, {k: NOW - 3600 for k in grants},
                        {k: GrantTerms(tier, 1) for k in grants}, UserLimits(), (), NOW)


def test_a_blocked_job_preempts_and_a_busy_one_does_not_again() -> None:
    urgent = job("p")
    matrix = matrix_of(FULL, {"h1": 2, "h2": 2})
    [made] = choose(blocked(urgent), {urgent.task_key: urgent}, running(), matrix, HOSTS,
                    NOW, 0.0)
    assert made.task_key == urgent.task_key and len(made.victims) == 1
    assert choose(blocked(urgent), {urgent.task_key: urgent}, running(), matrix, HOSTS, NOW,
                  0.0, busy={urgent.task_key}) == []
    assert choose(blocked(urgent), {urgent.task_key: urgent}, running(tier=5), matrix,
                  HOSTS, NOW, 0.0) == []  # the same tier, no fair share
    for reason in (USER_LIMIT, ""):  # not waiting for GPUs; admitted
        assert choose([Decision(urgent.task_key, 1, reason)], {urgent.task_key: urgent},
                      running(), matrix, HOSTS, NOW, 0.0) == []


def test_a_job_behind_a_blocked_one_preempts_only_outside_its_reservation() -> None:
    """The first blocked job (it cannot preempt: its owner's tier is not above) reserves
    h1 and h2; the urgent job behind it may not take GPUs there: they would not be its.
    On h3, which the first does not name, it may."""
    sizes = {"h1": 2, "h2": 2, "h3": 2}
    grants = {**FULL, key("c", "bob"): held(h3=(0, 1))}
    first = job("f", "carol", 0, gpus=2, hosts=("h1", "h2"))
    urgent = job("p", hosts=("h1", "h2"))
    jobs = {j.task_key: j for j in (first, urgent)}
    matrix = matrix_of(grants, sizes)
    assert choose(blocked(first, urgent), jobs, running(grants), matrix, sizes, NOW,
                  0.0) == []
    wider = job("p", hosts=("h1", "h2", "h3"))
    [made] = choose(blocked(first, wider), {**jobs, wider.task_key: wider},
                    running(grants), matrix, sizes, NOW, 0.0)
    assert made.victims == (key("c", "bob"),)


def test_a_pass_decides_few_shapes_and_asks_the_standing_once() -> None:
    sizes = {f"h{i}": 2 for i in range(8)}
    grants = {key(f"r{i}", "bob"): held(**{f"h{i}": (0, 1)}) for i in range(8)}
    hosts = tuple(sizes)
    asked: list[int] = []

    def standing() -> None:
        asked.append(1)

    many = [job(f"p{i}", gpus=2, hosts=(hosts[i],)) for i in range(8)]
    made = choose(blocked(*many), {j.task_key: j for j in many}, running(grants),
                  matrix_of(grants, sizes), hosts, NOW, 0.0, standing)
    assert len(made) == 3 and asked == [1]  # MAX_CALLS decisions, one standing
    same = [job(f"q{i}", gpus=2, hosts=hosts) for i in range(3)]
    made = choose(blocked(*same), {j.task_key: j for j in same}, running(grants),
                  matrix_of(grants, sizes), hosts, NOW, 0.0)
    assert len(made) == 1  # one shape, once: and it reserves every host for the first
    assert choose([], {}, running(grants), matrix_of(grants, sizes), hosts, NOW, 0.0,
                  standing) == [] and asked == [1]  # nothing blocked: no standing asked


def test_busy_preemptors_and_reasons_follow_the_victims_cells() -> None:
    preempter = Preempter(cast(Store, None), PreemptSettings(on=True))
    victim = key("a", "bob")
    preempter.notices = {victim: notice(victim, by=key("p", "alice"))}
    matrix = Matrix({"h1": [DRAINING + victim, FREE]})
    assert jobs_in(matrix) == {victim}
    preempter.note_busy({}, matrix)  # its grant is gone, its cells still draining
    assert preempter.busy == {key("p", "alice")}
    decisions = [Decision(key("p", "alice"), 1, PRIORITY), Decision(key("x", "bob"), 2,
                                                                    RESOURCES)]
    assert preempter.reasons(decisions) == {key("p", "alice"): PREEMPTING}
    preempter.note_busy({}, Matrix({"h1": [FREE, FREE]}))
    assert preempter.busy == set() and preempter.reasons(decisions) == {}


# -- records, limits, the sync's and the agents' words -----------------------------------------
def test_a_records_resumes_is_a_task_key_or_refused() -> None:
    record = {"task_key": key("r", "bob"), "state": "queued",
              "queue": {"hosts": ["h1"], "slots": [["worker", 0, 1]],
                        "resumes": key("v", "bob")}}
    assert waiting_from_record(record, 5, key("r", "bob")).resumes == key("v", "bob")
    for bad in (5, "../../grants/x", "x" * 200):
        with pytest.raises(InvalidRequest, match="resumes"):
            waiting_from_record({**record, "queue": {**record["queue"], "resumes": bad}}, 5,
                                key("r", "bob"))
    with pytest.raises(InvalidRequest, match="no_preempt"):  # a user's wish: no such field
        waiting_from_record({**record, "queue": {**record["queue"], "no_preempt": True}}, 5,
                            key("r", "bob"))


def test_only_the_admins_limits_exempt_a_user_and_it_can_be_undone() -> None:
    limits = UserLimits().with_user("bob", None, None, no_preempt_ok=True)
    assert not limits.preemptible("bob") and limits.preemptible("alice")
    again = UserLimits.from_json(limits.to_json())
    assert not again.preemptible("bob")
    assert again.with_user("bob", 3, None).of("bob").no_preempt_ok  # kept by other changes
    assert again.with_user("bob", None, None, no_preempt_ok=False).preemptible("bob")
    damaged = json.dumps({"format": 1, "users": {"bob": {"max_priority": 1,
                                                          "no_preempt_ok": "yes"}}})
    assert UserLimits.from_json(damaged.encode()).preemptible("bob")  # only true exempts
    assert b"no_preempt_ok" not in UserLimits().with_user("bob", 1, None).to_json()


def test_a_victim_whose_launcher_went_ends_preempted_by_its_preemptor() -> None:
    record = {"task_key": key("v", "bob"), "state": "running"}
    ended = preempted(record, key("p", "alice"), NOW - 5, NOW)
    assert ended is not None and ended["state"] == "preempted"
    assert dict(ended)["preempted_by"] == key("p", "alice")
    assert preempted({**record, "state": "succeeded"}, key("p", "alice"), NOW, NOW) is None


def test_an_agent_stops_a_live_job_only_when_drained_and_preempted() -> None:
    matrix = Matrix({"h1": [DRAINING + "live", "held", DRAINING + "old"]})
    assert matrix.ended_on("h1", {"live", "held"}) == {"old"}
    assert matrix.ended_on("h1", {"live", "held"}, {"live", "held"}) == {"live", "old"}


def test_the_view_shows_the_preemption_reasons_and_counts() -> None:
    urgent = job("p")
    waiting = {urgent.task_key: urgent}
    shown = view_of(blocked(urgent), waiting, {urgent.task_key: PREEMPTING},
                    {"priority": 2, "fairshare": 1})
    assert shown["waiting"][0]["reason"] == PREEMPTING
    assert shown["preemptions_total"] == {"priority": 2, "fairshare": 1}
    assert "preemptions_total" not in view_of(blocked(urgent), waiting)


def test_the_three_settings_reach_the_cluster_settings(tmp_path: Path) -> None:
    def inventory(extra: str) -> Path:
        path = tmp_path / "cluster.yml"
        path.write_text('all:\n  vars:\n    hypertf_zookeeper_hosts: "zk:2181"\n'
                        f"{extra}  children:\n    gpu_nodes:\n      hosts:\n"
                        "        node1: {ansible_host: 10.0.0.1}\n")
        return path

    cluster = load_inventory(inventory("")).cluster
    assert (cluster.preempt, cluster.preempt_grace_s, cluster.preempt_min_runtime_s) == (
        False, 120.0, 600.0)
    cluster = load_inventory(inventory("    hypertf_preempt: true\n"
                                       "    hypertf_preempt_grace_s: 20\n"
                                       "    hypertf_preempt_min_runtime_s: 0\n")).cluster
    assert (cluster.preempt, cluster.preempt_grace_s, cluster.preempt_min_runtime_s) == (
        True, 20.0, 0.0)
    with pytest.raises(InventoryError, match="hypertf_preempt_grace_s"):
        load_inventory(inventory("    hypertf_preempt_grace_s: -1\n"))


# -- cost --------------------------------------------------------------------------------------
def test_a_pass_at_25000_hosts_with_1000_waiting_decides_in_bounded_time() -> None:
    """Every GPU held by 1,000 running jobs of 25 hosts each, 1,000 jobs waiting (each
    naming every host, as the inventory's expansion shares one tuple): the running jobs
    built from the grants and the pass's decisions take a small part of the 0.5 s pass."""
    hosts = expand_hosts(("n[00000:24999]",))
    sizes = dict.fromkeys(hosts, 8)
    grants = {key(f"r{j}", f"u{j % 50}"): Held({h: tuple(range(8))
                                                for h in hosts[j * 25:(j + 1) * 25]}, {})
              for j in range(1000)}
    terms = {k: GrantTerms(j % 3, j) for j, k in enumerate(grants)}
    matrix = matrix_of(grants, sizes)
    waiting = [Waiting(key(f"w{i}", f"v{i % 40}"), Request((TaskSlot("worker", 0, 8),), hosts),
                       5, 10_000 + i) for i in range(1000)]
    jobs = {w.task_key: w for w in waiting}
    decisions = blocked(*waiting)
    start = time.perf_counter()
    pool = running_jobs(grants, {k: NOW - 3600 for k in grants}, terms, UserLimits(), (),
                        NOW)
    made = choose(decisions, jobs, pool, matrix, hosts, NOW, 600.0)
    took = time.perf_counter() - start
    assert len(made) == 1 and len(made[0].victims) == 1  # one shape; it reserves every host
    assert took < 0.4, took  # ~40 ms here quiet; 0.24 s seen with the suite's load
