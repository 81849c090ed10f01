# What the bridge sends the board, checked as the bridge's gate.py checks what the board sends.
#
# A signed receipt releases journaled events from the outbox: idempotent, so neither its boot nor
# its sequence needs to be fresh. A signed relay command must be fresh (not retained, for this
# boot, above every command seq taken, within the TTL once NTP has set the clock) and is answered,
# run or refused, with a signed ack. Bytes that do not verify get no answer: nothing in them can be
# trusted, not even an id to answer to.
import protocol


class CommandGate:
    def __init__(self, board, signer, sid, boot, receipt, run, relay_on, answer, log):
        self.board = board
        self.signer = signer
        self.sid = sid
        self.boot = boot
        self.receipt = receipt  # (boot, seq) of an event the bridge journaled
        self.run = run  # (op, ms) -> the reason it was refused, or None once done
        self.relay_on = relay_on  # () -> the relay's state for the ack (None: no relay)
        self.answer = answer  # (ack) -> sealed and sent back on every path
        self.log = log
        self.seq = 0  # the highest command seq taken in this boot
        self.refused = 0

    def take(self, payload, retained, via):
        try:
            msg = protocol.open_envelope(payload, self.signer, self.sid)
            if msg["kind"] == protocol.EVACK_KIND and not retained:
                for boot, seq in protocol.check_evack(msg["data"]):
                    self.receipt(boot, seq)
                return
            if msg["kind"] != protocol.CMD_KIND:
                raise protocol.ProtocolError(protocol.SCHEMA, "kind %r is not a command" % msg["kind"])
        except protocol.ProtocolError as e:
            self.refused += 1
            self.log("cmd", "refused from", via + ":", str(e))
            return
        data = msg["data"]
        cid = data.get("id") if isinstance(data.get("id"), str) else ""
        op = data.get("op")
        reason = detail = None
        if retained:
            # A retained command would run again on every reconnect.
            reason, detail = protocol.RETAINED, "commands must not be retained"
        elif msg["boot"] != self.boot:
            reason, detail = protocol.STALE_BOOT, "for boot %s, this is %s" % (msg["boot"], self.boot)
        elif msg["seq"] <= self.seq:
            reason, detail = protocol.REPLAYED, "seq %d <= %d" % (msg["seq"], self.seq)
        elif self._expired(msg["ts"]):
            reason = protocol.EXPIRED
            detail = "sent at %s, the board's clock says %d" % (msg["ts"], self.board.now_unix())
        else:
            self.seq = msg["seq"]  # spent even if refused below: a replay of it stays refused
            try:
                op, cid, ms = protocol.check_command(data)
                reason = self.run(op, ms)
            except protocol.ProtocolError as e:
                reason, detail = e.reason, e.detail
        if reason:
            self.refused += 1
            self.log("cmd", "refused from", via + ":", reason, detail or "")
        else:
            self.log("cmd", op, "from", via)
        ack = {"id": cid, "op": op, "cmd_seq": msg["seq"], "ok": reason is None, "relay": self.relay_on()}
        if reason:
            ack["reason"] = reason
            ack["detail"] = detail or reason
        self.answer(ack)

    def _expired(self, ts):
        # Only once NTP has set the clock; before that, boot and sequence are the whole guard.
        now = self.board.now_unix()
        return now is not None and (ts is None or abs(now - ts) > protocol.CMD_TTL_S)
