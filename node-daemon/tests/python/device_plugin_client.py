#!/usr/bin/env python3
"""An independent device-plugin client (grpcio, stubs generated at run time
from proto/proto/deviceplugin_v1beta1.proto with grpcio-tools): proves the
daemon's wire format with a second gRPC implementation.

It registers nothing. It calls GetDevicePluginOptions, reads the first
ListAndWatch message, and sends one Allocate with the given device IDs, then
prints what it decoded as one JSON object on stdout:

  {"options": {...}, "devices": [{"id","health","numa"}], "allocate": [{"envs","mounts"}]}

or {"allocate_error": {"code": "...", "details": "..."}} when Allocate fails.

Usage: device_plugin_client.py --proto PROTO --socket SOCK --allocate ID [ID ...]
Needs: pip install grpcio grpcio-tools
"""

import argparse
import importlib
import json
import os
import sys
import tempfile


def generate_stubs(proto_path, out_dir):
    from grpc_tools import protoc
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    proto_dir, proto_file = os.path.split(os.path.abspath(proto_path))
    code = protoc.main(
        [
            "protoc",
            f"-I{proto_dir}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            proto_file,
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with {code}")
    sys.path.insert(0, out_dir)
    name = os.path.splitext(proto_file)[0]
    return importlib.import_module(f"{name}_pb2"), importlib.import_module(f"{name}_pb2_grpc")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--allocate", nargs="+", required=True, metavar="DEVICE_ID")
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()

    import grpc

    with tempfile.TemporaryDirectory() as out_dir:
        pb2, pb2_grpc = generate_stubs(args.proto, out_dir)
        # gRPC C-core sends the socket path as :authority on unix sockets,
        # which HTTP/2 servers built on h2 (tonic) reject as malformed;
        # grpc-go, which kubelet uses, sends "localhost". Do as kubelet does.
        target = f"unix://{os.path.abspath(args.socket)}"
        options = [("grpc.default_authority", "localhost")]
        with grpc.insecure_channel(target, options=options) as channel:
            grpc.channel_ready_future(channel).result(timeout=args.timeout)
            stub = pb2_grpc.DevicePluginStub(channel)
            result = {}

            options = stub.GetDevicePluginOptions(pb2.Empty(), timeout=args.timeout)
            result["options"] = {
                "pre_start_required": options.pre_start_required,
                "get_preferred_allocation_available": options.get_preferred_allocation_available,
            }

            stream = stub.ListAndWatch(pb2.Empty(), timeout=args.timeout)
            first = next(stream)
            result["devices"] = [
                {
                    "id": d.ID,
                    "health": d.health,
                    "numa": [n.ID for n in d.topology.nodes],
                }
                for d in first.devices
            ]
            stream.cancel()

            request = pb2.AllocateRequest(
                container_requests=[pb2.ContainerAllocateRequest(devices_ids=args.allocate)]
            )
            try:
                response = stub.Allocate(request, timeout=args.timeout)
                result["allocate"] = [
                    {
                        "envs": dict(c.envs),
                        "mounts": [
                            {
                                "container_path": m.container_path,
                                "host_path": m.host_path,
                                "read_only": m.read_only,
                            }
                            for m in c.mounts
                        ],
                    }
                    for c in response.container_responses
                ]
            except grpc.RpcError as error:
                result["allocate_error"] = {"code": error.code().name, "details": error.details()}
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
