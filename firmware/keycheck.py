# Whether a sentinel key is fit to sign with: the one rule the board's config check and the
# bridge's settings share, so both refuse the same keys.
#
# Its own module, not protocol's, because the board needs it once, at boot: the config check
# imports it and the sentinel drops it with the validator's tables, while protocol stays loaded
# for the board's whole life (every byte of it counts against the ESP32's heap).

import math

KEY_MIN = 16  # characters; `holdover keygen` makes 64 hex characters (32 random bytes)
KEY_MIN_BITS = 36  # estimated from the key's own characters; random hex of 16 scores about 53
# Words that mark a key copied from an example rather than made.
_PLACEHOLDERS = (
    "change",
    "replace",
    "placeholder",
    "example",
    "your",
    "secret",
    "password",
    "xxxx",
    "todo",
    "keygen",
    "<",
    "...",
)


def key_problem(key):
    """Why a sentinel key must not be used (short, a placeholder, predictable), or None.

    Shared by the board's config check and the bridge's, so both refuse the same keys."""
    if not isinstance(key, str):
        return "must be a string"
    n = len(key)
    if n < KEY_MIN:
        return "must be at least %d characters (make one: holdover keygen SENTINEL)" % KEY_MIN
    low = key.lower()
    for word in _PLACEHOLDERS:
        if word in low:
            return "looks like a placeholder ('%s'); make a key: holdover keygen SENTINEL" % word
    counts = {}
    for c in key:
        counts[c] = counts.get(c, 0) + 1
    bits = 0.0
    for k in counts.values():
        bits -= k * math.log(k / n)
    bits /= math.log(2)
    # Runs (abcd, 4321) and repeats (aaaa, by the bits) are what people type when asked for random.
    steps = 0
    for i in range(1, n):
        if ord(key[i]) - ord(key[i - 1]) in (-1, 1):
            steps += 1
    if bits < KEY_MIN_BITS:
        return "too predictable (about %d bits in its characters); make a key: holdover keygen SENTINEL" % bits
    if 2 * steps >= n:
        return "too predictable (runs of consecutive characters); make a key: holdover keygen SENTINEL"
    return None
