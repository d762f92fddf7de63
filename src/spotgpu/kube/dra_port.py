"""The DRA driver's :class:`~spotgpu.dra.ports.DraApi` over the real Kubernetes API (raw JSON).

Decides nothing. Side effects: HTTP requests to the API server: GET of ResourceClaims (never
cached: Prepare must see the claim as it is now) and of the Node, list/create/update/delete of
``resource.k8s.io/v1`` ResourceSlices. Plain JSON through :attr:`Connection.rest`, so fields of
newer API releases pass through untouched. Errors as :mod:`spotgpu.kube.client` translates them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from spotgpu.core.ids import NodeName
from spotgpu.dra.claim import DriverName
from spotgpu.kube.client import Connection, NotFound, api_errors, json_answer

SLICES: Final = "/apis/resource.k8s.io/v1/resourceslices"


class KubeDraApi:
    def __init__(self, connection: Connection) -> None:
        self._c = connection

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        try:
            return self._c.get(path, {}, f"get ResourceClaim {namespace}/{name}")
        except NotFound:
            return None

    def node_uid(self, node: NodeName) -> str:
        return str(self._c.get(f"/api/v1/nodes/{node}", {}, f"get Node {node}")["metadata"]["uid"])

    def list_slices(self, driver: DriverName, node: NodeName) -> Sequence[Mapping[str, Any]]:
        selector = {"fieldSelector": f"spec.driver={driver},spec.nodeName={node}"}
        items = self._c.get(SLICES, selector, "list ResourceSlices").get("items") or []
        return [i for i in items if isinstance(i, Mapping)]

    def create_slice(self, obj: Mapping[str, Any]) -> None:
        self._c.post(SLICES, obj, "create ResourceSlice")

    def update_slice(self, obj: Mapping[str, Any]) -> None:
        name = obj["metadata"]["name"]
        what = f"update ResourceSlice {name}"
        with api_errors(what):
            resp = self._c.rest.put(f"{SLICES}/{name}", json=dict(obj))
        json_answer(resp, what)

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        what = f"delete ResourceSlice {name}"
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"uid": uid, "resourceVersion": resource_version},
        }
        try:
            with api_errors(what):
                resp = self._c.rest.request("DELETE", f"{SLICES}/{name}", json=body)
            json_answer(resp, what)
        except NotFound:
            return


__all__ = ["KubeDraApi"]
