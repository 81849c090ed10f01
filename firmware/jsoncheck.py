# Whether a text is exactly one strict JSON value, before MicroPython's json module reads it:
# that module takes ',' and ':' as whitespace, so '{"debounce_ms":}' or a missing comma would
# load as something else without a word. A board config with such a slip is refused by line and
# column instead (config.load, and `holdover deploy` through board/config_check.py).


class _Bad(Exception):
    pass


def syntax_error(s):
    """None if s is exactly one strict JSON value, else "line L, column C: what was expected".

    MicroPython's json module reads ',' and ':' as whitespace, so '{"debounce_ms":}' or a
    missing comma parse into something else without a word; this checks the grammar first.
    """
    n = len(s)

    def ws(i):
        while i < n and s[i] in " \t\r\n":
            i += 1
        return i

    def bad(i, what):
        line, start = 1, 0
        for j in range(min(i, n)):
            if s[j] == "\n":
                line, start = line + 1, j + 1
        raise _Bad("line %d, column %d: %s" % (line, i - start + 1, what))

    def string(i):
        i += 1
        while i < n:
            c = s[i]
            if c == '"':
                return i + 1
            if c == "\\":
                if i + 1 >= n or s[i + 1] not in '"\\/bfnrtu':
                    bad(i, "bad escape in a string")
                if s[i + 1] == "u":
                    h = s[i + 2 : i + 6]
                    if len(h) != 4 or any(x not in "0123456789abcdefABCDEF" for x in h):
                        bad(i, "bad \\u escape")
                    i += 4
                i += 2
                continue
            if ord(c) < 0x20:
                bad(i, "a control character in a string")
            i += 1
        bad(i, "a string never closed")

    def digits(i):
        j = i
        while i < n and "0" <= s[i] <= "9":
            i += 1
        if i == j:
            bad(i, "a digit expected")
        return i

    def number(i):
        if s[i] == "-":
            i += 1
        if i < n and s[i] == "0":
            i += 1
        else:
            i = digits(i)
        if i < n and s[i] == ".":
            i = digits(i + 1)
        if i < n and s[i] in "eE":
            i += 1
            if i < n and s[i] in "+-":
                i += 1
            i = digits(i)
        return i

    def value(i, depth):
        if depth > 16:
            bad(i, "nested too deep")
        i = ws(i)
        if i >= n:
            bad(i, "a value expected")
        c = s[i]
        if c == "{" or c == "[":
            close = "}" if c == "{" else "]"
            i = ws(i + 1)
            if i < n and s[i] == close:
                return i + 1
            while True:
                if c == "{":
                    i = ws(i)
                    if i >= n or s[i] != '"':
                        bad(i, "a key in double quotes expected")
                    i = ws(string(i))
                    if i >= n or s[i] != ":":
                        bad(i, "':' expected")
                    i += 1
                i = ws(value(i, depth + 1))
                if i < n and s[i] == ",":
                    i += 1
                    continue
                if i < n and s[i] == close:
                    return i + 1
                bad(i, "',' or '%s' expected" % close)
        if c == '"':
            return string(i)
        for lit in ("true", "false", "null"):
            if s[i : i + len(lit)] == lit:
                return i + len(lit)
        if c == "-" or "0" <= c <= "9":
            return number(i)
        bad(i, "a value expected")

    try:
        i = ws(value(0, 0))
        if i != n:
            bad(i, "nothing expected after the value")
    except _Bad as e:
        return str(e)
    return None
