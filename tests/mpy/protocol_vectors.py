# Runs inside MicroPython: applies the protocol module to the vectors file given in argv[1]
# and prints one JSON object of results, which the CPython test compares with its own.
import binascii
import json
import sys

import protocol

with open(sys.argv[1]) as f:
    vec = json.loads(f.read())

out = {"hmac": [], "open": [], "sealed": []}
for case in vec["hmac"]:
    s = protocol.Signer(binascii.unhexlify(case["key"]))
    out["hmac"].append(binascii.hexlify(s.digest(binascii.unhexlify(case["msg"]))).decode())

signer = protocol.Signer(vec["key"])
for case in vec["open"]:
    try:
        body = protocol.open_envelope(binascii.unhexlify(case["payload"]), signer, case["sid"])
        out["open"].append(["ok", body["kind"], body["seq"]])
    except protocol.ProtocolError as e:
        out["open"].append(["rejected", e.reason])

for b in vec["to_seal"]:
    out["sealed"].append(protocol.seal(signer, b).decode())

print(json.dumps(out))
