"""The host's UPS through apcupsd's network information server (NIS, port 3551): what `apcaccess`
reads, for those who run apcupsd instead of NUT.

The wire is Home Assistant's client (PyPI `aioapcaccess`); what is ours is bounding it (a silent or
endless server would otherwise hold the read forever) and reading apcupsd's words the way NUT's
are read, so the rest of the bridge sees one kind of UPS:

    STATUS   : ONBATT LOWBATT     ->  OB LB
    TIMELEFT : 7.5 Minutes        ->  battery.runtime 450
    BCHARGE  : 81.0 Percent       ->  battery.charge 81
    LOADPCT  : 33.0 Percent       ->  ups.load 33
"""

from __future__ import annotations

import asyncio

import aioapcaccess

from holdover.node.nut_client import NutError

# apcupsd's STATUS words (its statflag, as apcaccess prints it) in NUT's ups.status words.
WORDS = {
    "ONLINE": "OL",
    "ONBATT": "OB",
    "LOWBATT": "LB",
    "SHUTTING DOWN": "FSD",
    "REPLACEBATT": "RB",
    "OVERLOAD": "OVER",
    "TRIM": "TRIM",
    "BOOST": "BOOST",
    "CAL": "CAL",
    "NOBATT": "NOBATT",
}
UNITS = {"TIMELEFT": ("Minutes", 60.0), "BCHARGE": ("Percent", 1.0), "LOADPCT": ("Percent", 1.0)}
NUT_NAMES = {"TIMELEFT": "battery.runtime", "BCHARGE": "battery.charge", "LOADPCT": "ups.load"}


def read(host: str, port: int, timeout: float) -> dict[str, str]:
    """One status read, blocking (call it off the loop): apcupsd's fields in NUT's names, as
    node.ups.reading() takes them."""
    where = f"apcupsd at {host}:{port}"
    try:
        found = asyncio.run(asyncio.wait_for(aioapcaccess.request_status(host, port), timeout))
    except TimeoutError:
        raise NutError(f"{where} did not answer within {timeout:g} s") from None
    except OSError as e:
        raise NutError(f"cannot reach {where}: {e.strerror or e}") from None
    except asyncio.IncompleteReadError:
        raise NutError(f"{where} closed the connection before the end of its status") from None
    except asyncio.LimitOverrunError:
        raise NutError(f"{where} sent no end to its status (is it apcupsd's NIS?)") from None
    except ValueError:  # not `NAME : value` records (UnicodeDecodeError is a ValueError too)
        raise NutError(f"{where} answered garbage, not apcupsd's NAME : value records") from None
    return nut_vars(found, where)


def nut_vars(found: dict[str, str], where: str) -> dict[str, str]:
    status = found.get("STATUS", "").strip()
    if not status:
        raise NutError(f"{where} reports no STATUS")
    if "COMMLOST" in status:
        raise NutError(f"{where} lost its UPS (COMMLOST: check the cable, apcupsd's log)")
    said = status.replace("SHUTTING DOWN", "SHUTTING_DOWN").split()
    words = [WORDS[w.replace("_", " ")] for w in said if w.replace("_", " ") in WORDS]
    if not words:
        raise NutError(f"{where} reports a STATUS holdover does not know: {status!r}")
    out = {"ups.status": " ".join(words)}
    for field, (unit, scale) in UNITS.items():
        value, unit_said = aioapcaccess.split_unit(found.get(field, ""))
        try:
            number = float(value) * scale
        except ValueError:
            continue  # absent or not a number: the reading says so, as for NUT
        if unit_said is None or unit_said.startswith(unit):  # older apcupsd: "Percent Load Capacity"
            out[NUT_NAMES[field]] = f"{number:g}"
    return out
