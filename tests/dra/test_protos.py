"""Our DRA, registration and health protos against the wire facts (shared/reference/dra.md 1-2).

The generated stubs are checked for freshness by scripts/gen_protos.py; this checks the .proto
files themselves: the packages (part of every method path), the services, and each field's
number and type, as the kubelet's own protos have them.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from spotgpu.adapters.proto import (
    dra_health_v1_pb2,
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)

STR, BOOL, I64, MSG, ENUM = (
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_BOOL,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_MESSAGE,
    FieldDescriptor.TYPE_ENUM,
)


def fields(message: Descriptor) -> dict[str, tuple[int, int, bool]]:
    return {f.name: (f.number, f.type, f.is_repeated) for f in message.fields}


def test_dra_plugin_v1_and_v1beta1_methods_and_fields() -> None:
    for module, package in (
        (dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1"),
        (dra_v1beta1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1beta1"),
    ):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert service.full_name == f"{package}.DRAPlugin"
        assert {m.name for m in service.methods} == {"NodePrepareResources", "NodeUnprepareResources"}
        msgs = module.DESCRIPTOR.message_types_by_name
        assert fields(msgs["Claim"]) == {"namespace": (1, STR, False), "uid": (2, STR, False), "name": (3, STR, False)}
        assert fields(msgs["NodePrepareResourcesRequest"]) == {"claims": (1, MSG, True)}
        assert fields(msgs["NodePrepareResourceResponse"]) == {"devices": (1, MSG, True), "error": (2, STR, False)}
        assert fields(msgs["NodeUnprepareResourceResponse"]) == {"error": (1, STR, False)}
        claims_map = msgs["NodePrepareResourcesResponse"].fields_by_name["claims"]
        assert claims_map.number == 1 and claims_map.message_type.GetOptions().map_entry
        device = fields(msgs["Device"])
        base = {
            "request_names": (1, STR, True),
            "pool_name": (2, STR, False),
            "device_name": (3, STR, False),
            "cdi_device_ids": (4, STR, True),
        }
        if module is dra_v1_pb2:
            assert device == {**base, "share_id": (5, STR, False)}
            assert msgs["Device"].fields_by_name["share_id"].has_presence  # proto3 optional
        else:
            assert device == base


def test_registration_and_health() -> None:
    reg = pluginregistration_v1_pb2.DESCRIPTOR
    assert reg.services_by_name["Registration"].full_name == "pluginregistration.Registration"
    assert fields(reg.message_types_by_name["PluginInfo"]) == {
        "type": (1, STR, False),
        "name": (2, STR, False),
        "endpoint": (3, STR, False),
        "supported_versions": (4, STR, True),
    }
    assert fields(reg.message_types_by_name["RegistrationStatus"]) == {
        "plugin_registered": (1, BOOL, False),
        "error": (2, STR, False),
    }
    for module, package in ((dra_health_v1_pb2, "v1"), (dra_health_v1alpha1_pb2, "v1alpha1")):
        d = module.DESCRIPTOR
        method = d.services_by_name["DRAResourceHealth"].methods_by_name["NodeWatchResources"]
        assert method.full_name == f"{package}.DRAResourceHealth.NodeWatchResources"
        assert method.server_streaming and not method.client_streaming
        assert fields(d.message_types_by_name["DeviceHealth"]) == {
            "device": (1, MSG, False),
            "health": (2, ENUM, False),
            "last_updated_time": (3, I64, False),
            "health_check_timeout_seconds": (4, I64, False),
            "message": (5, STR, False),
        }
        assert fields(d.message_types_by_name["DeviceIdentifier"]) == {
            "pool_name": (1, STR, False),
            "device_name": (2, STR, False),
        }
        assert {v.name: v.number for v in d.enum_types_by_name["HealthStatus"].values} == {
            "UNKNOWN": 0,
            "HEALTHY": 1,
            "UNHEALTHY": 2,
        }
