# Runs inside MicroPython: the firmware's MQTT client against a broker at argv[1]:argv[2] for
# argv[3] ms, publishing QoS 0 every argv[4] ms (0: never), subscribed to argv[5] ("" for none).
# Prints its log lines, then one JSON line with what it saw. The board here is only the clock
# and a TCP connection: the client's own code is what is under test.
import asyncio
import json
import sys
import time

import mqtt


class Board:
    ticks_ms = staticmethod(time.ticks_ms)
    ticks_diff = staticmethod(time.ticks_diff)

    def net_up(self):
        return True

    async def open_connection(self, host, port):
        return await asyncio.open_connection(host, port)


host, port, run_ms, every_ms, sub = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
cfg = {
    "host": host,
    "port": port,
    "keepalive_s": 2,
    "ack_timeout_ms": 1000,
    "backoff_min_ms": 200,
    "backoff_max_ms": 30000,
    "queue_len": 16,
}
got = []


def log(*parts):
    print("#", " ".join(str(p) for p in parts))


def on_message(topic, payload, retained):
    got.append([topic, len(payload)])


c = mqtt.Client(Board(), cfg, "faults", on_message=on_message, log=log)
if sub:
    c.subscribe(sub)


def task_error(_loop, context):
    print("# task died:", context.get("message"), repr(context.get("exception")))


async def main():
    asyncio.get_event_loop().set_exception_handler(task_error)
    t = asyncio.create_task(c.run())
    start = time.ticks_ms()
    while time.ticks_diff(time.ticks_ms(), start) < run_ms:
        if every_ms:
            c.publish("t/telemetry", b"x" * 20, qos=0)
            await asyncio.sleep_ms(every_ms)
        else:
            await asyncio.sleep_ms(100)
    t.cancel()


asyncio.run(main())
print(json.dumps({"connects": c.connects, "oversized": c.oversized, "sub_failed": c.sub_failed, "got": got}))
