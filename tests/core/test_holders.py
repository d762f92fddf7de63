"""The release invariant's judgement (:mod:`spotgpu.core.holders`): properties over any scope."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.holders import Holding, ReleaseScope, Verdict, judge

UIDS = st.sampled_from([f"00000000-0000-0000-0000-00000000000{i}" for i in range(6)])
CIDS = st.sampled_from([c * 64 for c in "abcdef"])
UID_SETS = st.frozensets(UIDS, max_size=4)
CID_SETS = st.frozensets(CIDS, max_size=3)
SCOPES = st.builds(
    ReleaseScope,
    owner_pods=UID_SETS,
    owner_containers=CID_SETS,
    victim_pods=UID_SETS,
    gpu_pods=UID_SETS,
    known_pods=UID_SETS,
    exempt_pods=UID_SETS,
)
HOLDINGS = st.builds(
    Holding, pid=st.integers(1, 1 << 22), pod_uid=st.none() | UIDS, container_id=st.none() | CIDS,
    gpu=st.booleans(), control=st.booleans(),
)  # fmt: skip


@given(HOLDINGS, SCOPES)
def test_the_owners_exempt_pods_and_host_processes_are_never_condemned(process: Holding, scope: ReleaseScope) -> None:
    verdict = judge(process, scope)
    if process.pod_uid is None or process.pod_uid in scope.exempt_pods or process.pod_uid in scope.owner_pods:
        assert verdict is None
    if process.container_id in scope.owner_containers:
        assert verdict is None


@given(HOLDINGS, SCOPES)
def test_every_holder_in_a_victim_pod_dies_whatever_its_container(process: Holding, scope: ReleaseScope) -> None:
    if judge(process, scope) is None and process.pod_uid in scope.victim_pods:
        # spared: the owner's, exempt, or holding nothing (left to the pod's deletion)
        assert (
            process.pod_uid in scope.owner_pods | scope.exempt_pods
            or process.container_id in scope.owner_containers
            or not (process.gpu or process.control)
        )


@given(HOLDINGS, SCOPES)
def test_a_stranger_holding_the_owners_gpu_always_dies_when_the_owner_is_known(
    process: Holding, scope: ReleaseScope
) -> None:
    stranger = process.pod_uid is not None and process.pod_uid not in scope.owner_pods | scope.exempt_pods
    stranger = stranger and process.container_id not in scope.owner_containers
    if process.gpu and stranger and scope.owner_known:
        assert judge(process, scope) in (Verdict.VICTIM_POD, Verdict.FOREIGN_GPU_HOLDER)


@given(HOLDINGS, SCOPES)
def test_with_the_owner_unknown_no_gpu_holder_is_condemned_for_what_it_holds(
    process: Holding, scope: ReleaseScope
) -> None:
    unknown = ReleaseScope(
        victim_pods=scope.victim_pods, gpu_pods=scope.gpu_pods, known_pods=scope.known_pods,
        exempt_pods=scope.exempt_pods,
    )  # fmt: skip
    assert judge(process, unknown) is not Verdict.FOREIGN_GPU_HOLDER


def test_control_nodes_belong_to_gpu_holding_pods_and_unknown_pods_are_left_alone() -> None:
    cpu, gpu_pod, new = "c" * 8 + "-0000-0000-0000-" + "0" * 12, "g" * 8, "n" * 8
    scope = ReleaseScope(
        owner_pods=frozenset({"o"}), gpu_pods=frozenset({gpu_pod}), known_pods=frozenset({cpu, gpu_pod})
    )
    assert judge(Holding(1, cpu, None, control=True), scope) is Verdict.FOREIGN_CONTROL_HOLDER
    assert judge(Holding(2, gpu_pod, None, control=True), scope) is None  # another GPU's owner or spot pod
    assert judge(Holding(3, new, None, control=True), scope) is None  # created since the agent's view
    assert judge(Holding(4, new, None, gpu=True), scope) is Verdict.FOREIGN_GPU_HOLDER
