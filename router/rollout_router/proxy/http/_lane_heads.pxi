# The lane's two parsers (included by _lane.pyx): a client's request head, strict and narrow, and a replica's
# response head. Both work on C buffers with explicit lengths and never read past them.
#
# The request parser accepts only what it can forward exactly as the Python path would: ``GET`` or ``POST``,
# an origin-form target already in normal form, HTTP/1.1, one Host, at most one Content-Length, header
# values that llhttp would hand over byte for byte, no hop-by-hop header beyond ``Connection: keep-alive``.
# Anything else (a refusal to come, an Expect, a chunked body, HTTP/1.0, the fleet's hop mark, ...) is
# ``P_OTHER``: the Python path parses the same bytes from the start and answers them, so no error answer
# is written here. It is resumable: each byte is checked once as it comes and a line is read when its CRLF
# has come, so a head trickled byte by byte costs linear time and garbage is handed over at its first
# wrong byte, where llhttp refuses it.

cdef enum:
    P_INCOMPLETE = 0
    P_SIMPLE = 1
    P_OTHER = 2

# Why a request went to the Python path (the handover metric's reasons: HANDOVER_REASONS in _lane.pyx).
cdef enum:
    W_METHOD = 0      # not GET or POST (HEAD, OPTIONS, ...), or not a method at all
    W_TARGET = 1      # not an origin-form target in normal form (percent-escapes, dot segments, '#', ...)
    W_VERSION = 2     # not HTTP/1.1
    W_HEADER = 3      # a header field llhttp might read otherwise (a bad byte, bare LF, obs-fold, ...)
    W_HOP = 4         # a hop-by-hop or framing header: Connection other than keep-alive, Expect, TE, Upgrade, ...
    W_MARK = 5        # the fleet's hop mark: another router sent it
    W_HOST = 6        # not exactly one Host
    W_SIZE = 7        # a head over MAX_HEAD bytes or MAX_FIELDS fields
    W_BODY = 8        # a body over maxBodyBytes
    W_BUDGET = 9      # the byte budget is full
    W_ROUTE = 10      # the router's Python declined (a probe, a key to check, a fleet hop, a pause, ...), or a
                      # sibling worker asked for the replica would not route it (relayed to the key's owner)
    W_SLOW = 11       # a request still arriving at a sweep: the Python path times it
    W_REFUSED = 12    # connecting to the replica failed: the Python path retries elsewhere
    W_ADMIT = 13      # the connection limit: the Python path refuses it
    W_BACKLOG = 14    # requests wait while the client reads none of its answers: the Python path queues them
    W_REASONS = 15

cdef enum:
    MAX_HEAD = 65536    # server.py MAX_HEAD
    MAX_FIELDS = 100    # server.py MAX_HEADERS
    MAX_NAMES = 8       # key header names looked for (session then group), at most
    MAX_DIGITS = 15     # Content-Length digits (below 2**53)

cdef unsigned char TCHAR[256]    # token characters (RFC 9110 5.6.2)
cdef unsigned char LOWER[256]    # ASCII lower case, other bytes as they are
cdef unsigned char VALUE[256]    # bytes llhttp takes in a header value: HTAB, SP, VCHAR, obs-text
cdef unsigned char TARGET[256]   # bytes of a target in normal form: VCHAR but '#', '%' and '\\'


cdef void _tables():
    cdef int c
    for c in range(256):
        LOWER[c] = c + 32 if 65 <= c <= 90 else c
        TCHAR[c] = (48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122) or c in b"!#$%&'*+-.^_`|~"
        VALUE[c] = c == 9 or (32 <= c <= 126) or c >= 128
        TARGET[c] = 33 <= c <= 126 and c not in b"#%\\"


_tables()


cdef struct Field:       # offsets into the buffer the head is in (a head is far below 4 GiB: 32 bits each)
    unsigned int name
    unsigned int colon
    unsigned int value
    unsigned int end      # the value's end (the line's CR)
    unsigned char kept    # forwarded to the replica


cdef struct Head:
    # the resumable parser's place
    Py_ssize_t line       # where the line being read starts
    Py_ssize_t seen       # bytes of that line checked so far
    int stage             # 0: the request line, 1: header fields
    # the request
    Py_ssize_t length     # the head's bytes, through its blank line
    int post
    Py_ssize_t target
    Py_ssize_t target_end
    Py_ssize_t path_end   # the target's path ends here (its query, if any, after)
    long long body        # Content-Length (0 when absent)
    int has_length
    int hosts
    int nfields
    int why               # a W_ reason, when P_OTHER
    Field fields[MAX_FIELDS]
    Py_ssize_t key[MAX_NAMES]       # the first value of each key header name (-1: absent)
    Py_ssize_t key_end[MAX_NAMES]


cdef inline void head_reset(Head* h) noexcept:
    h.line = h.seen = 0
    h.stage = 0
    h.length = h.post = h.target = h.target_end = h.path_end = 0
    h.body = h.has_length = h.hosts = h.nfields = h.why = 0
    cdef int i
    for i in range(MAX_NAMES):
        h.key[i] = -1
        h.key_end[i] = -1


cdef inline bint same_lower(const unsigned char* s, Py_ssize_t n, const char* lower) noexcept:
    """Whether ``s[:n]``, lower-cased, is the NUL-terminated ``lower``."""
    cdef Py_ssize_t i
    for i in range(n):
        if lower[i] == 0 or LOWER[s[i]] != <unsigned char>lower[i]:
            return False
    return lower[n] == 0


cdef inline int other(Head* h, int why) noexcept:
    h.why = why
    return P_OTHER


cdef int partial_ok(const unsigned char* s, Py_ssize_t start, Py_ssize_t end, int stage) noexcept:
    """Whether bytes of a line not ended yet can still begin a line the lane takes: checked as they come, so
    garbage is handed over at its first wrong byte (llhttp refuses it there) and a line is checked once."""
    cdef Py_ssize_t i
    cdef unsigned char c
    for i in range(start, end):
        c = s[i]
        if c == 13:
            if i + 1 < end:  # a CR not followed by its LF (the caller has looked for CRLF up to here)
                return 0
        elif stage == 0:
            if c != 32 and not 33 <= c <= 126:
                return 0
        elif not VALUE[c]:
            return 0
    return 1


cdef int request_line(const unsigned char* s, Py_ssize_t start, Py_ssize_t end, Head* h) noexcept:
    """``METHOD SP target SP HTTP/1.1``: the line's bytes are ``s[start:end]`` (its CRLF after)."""
    cdef Py_ssize_t i = start, t
    if end - start >= 4 and memcmp(s + start, b"GET ", 4) == 0:
        h.post, i = 0, start + 4
    elif end - start >= 5 and memcmp(s + start, b"POST ", 5) == 0:
        h.post, i = 1, start + 5
    else:
        return other(h, W_METHOD)
    if i >= end or s[i] != 47:  # '/': origin form only
        return other(h, W_TARGET)
    t = i
    h.path_end = -1
    while i < end and s[i] != 32:
        if not TARGET[s[i]]:
            return other(h, W_TARGET)
        if s[i] == 63 and h.path_end < 0:  # '?'
            h.path_end = i
        elif s[i] == 46 and h.path_end < 0 and s[i - 1] == 47:  # "/." : a dot segment, maybe
            return other(h, W_TARGET)
        i += 1
    h.target, h.target_end = t, i
    if h.path_end < 0:
        h.path_end = i
    if end - i != 9 or memcmp(s + i, b" HTTP/1.1", 9) != 0:
        return other(h, W_VERSION)
    return P_SIMPLE


cdef int header_line(const unsigned char* s, Py_ssize_t start, Py_ssize_t end, Head* h,
                     const char** names, const Py_ssize_t* sizes, int count) noexcept:
    """``name: value``: one field of the head, sorted as ``server.py``'s ``on_header`` sorts it."""
    cdef Py_ssize_t i = start, colon, value, n
    cdef int k
    cdef unsigned char c
    cdef Field* f
    while i < end and TCHAR[s[i]]:
        i += 1
    if i == start or i == end or s[i] != 58:  # an empty name, a byte that is no token's, or no colon
        return other(h, W_HEADER)
    colon = i
    n = colon - start
    i += 1
    while i < end and (s[i] == 32 or s[i] == 9):
        i += 1
    value = i
    while i < end:
        if not VALUE[s[i]]:
            return other(h, W_HEADER)
        i += 1
    if h.nfields >= MAX_FIELDS:
        return other(h, W_SIZE)
    f = &h.fields[h.nfields]
    h.nfields += 1
    f.name, f.colon, f.value, f.end, f.kept = start, colon, value, end, 1
    for k in range(count):  # a key header: forwarded, and its first value read
        if sizes[k] == n and same_lower(s + start, n, names[k]):
            if h.key[k] < 0:
                h.key[k], h.key_end[k] = value, end
            return P_SIMPLE
    c = LOWER[s[start]]
    if c == 104 and same_lower(s + start, n, b"host"):
        h.hosts += 1
        f.kept = 0
    elif c == 99 and same_lower(s + start, n, b"content-length"):
        if h.has_length or end == value or end - value > MAX_DIGITS:
            return other(h, W_HEADER)
        h.has_length, h.body = 1, 0
        for i in range(value, end):
            if not 48 <= s[i] <= 57:
                return other(h, W_HEADER)
            h.body = h.body * 10 + (s[i] - 48)
        f.kept = 0
    elif c == 99 and same_lower(s + start, n, b"connection"):
        if not same_lower(s + value, end - value, b"keep-alive"):
            return other(h, W_HOP)  # close, a list, or names of headers to drop: the Python path's
        f.kept = 0
    elif c == 120 and same_lower(s + start, n, b"x-rolloutrouter-forwarded-by"):
        return other(h, W_MARK)
    elif (same_lower(s + start, n, b"transfer-encoding") or same_lower(s + start, n, b"expect")
          or same_lower(s + start, n, b"upgrade") or same_lower(s + start, n, b"te")
          or same_lower(s + start, n, b"trailer") or same_lower(s + start, n, b"trailers")
          or same_lower(s + start, n, b"keep-alive") or same_lower(s + start, n, b"proxy-connection")
          or same_lower(s + start, n, b"proxy-authenticate") or same_lower(s + start, n, b"proxy-authorization")):
        return other(h, W_HOP)
    return P_SIMPLE


cdef int parse_request(const unsigned char* s, Py_ssize_t size, Head* h,
                       const char** names, const Py_ssize_t* sizes, int count) noexcept:
    """Read ``s[:size]`` on from where the last call stopped: P_SIMPLE with the head in ``h``, P_OTHER (and
    ``h.why``), or P_INCOMPLETE (call again with more bytes)."""
    cdef Py_ssize_t i, cr
    cdef int result
    while True:
        if size <= h.line:
            return P_INCOMPLETE
        i = h.line + h.seen
        cr = -1
        while i + 1 < size:
            if s[i] == 13:
                if s[i + 1] != 10:
                    return other(h, W_HEADER)
                cr = i
                break
            i += 1
        if cr < 0:
            if not partial_ok(s, h.line + h.seen, size, h.stage):
                return other(h, W_METHOD if h.stage == 0 else W_HEADER)
            h.seen = (size - h.line) - (1 if s[size - 1] == 13 else 0)
            if size > MAX_HEAD:
                return other(h, W_SIZE)
            return P_INCOMPLETE
        if cr + 2 > MAX_HEAD:
            return other(h, W_SIZE)
        if h.stage == 0:
            result = request_line(s, h.line, cr, h)
            h.stage = 1
        elif cr == h.line:  # the blank line: the head is whole
            h.length = cr + 2
            if h.hosts != 1:
                return other(h, W_HOST)
            return P_SIMPLE
        else:
            result = header_line(s, h.line, cr, h, names, sizes, count)
        if result != P_SIMPLE:
            return result
        h.line, h.seen = cr + 2, 0


# --- a replica's response head ---

cdef struct Response:
    Py_ssize_t length     # the head's bytes, through its blank line
    int status
    int http10
    Py_ssize_t reason
    Py_ssize_t reason_end
    Py_ssize_t content_length   # where the Content-Length value is (-1: none)
    Py_ssize_t content_length_end
    long long body
    int chunked
    int close             # Connection: close (HTTP/1.1), or HTTP/1.0 without keep-alive
    int keep              # Connection: keep-alive
    int nfields
    Field fields[MAX_FIELDS]
    const char* error     # why the head is refused (NULL: it is not)


cdef Py_ssize_t head_end(const unsigned char* s, Py_ssize_t start, Py_ssize_t size) noexcept:
    """The end of the first blank line at or after ``start`` (-1: not yet); ``start`` is where the last look
    stopped, less three bytes."""
    cdef Py_ssize_t i = start
    while i + 3 < size:
        if s[i] == 13 and s[i + 1] == 10 and s[i + 2] == 13 and s[i + 3] == 10:
            return i + 4
        i += 1
    return -1


cdef inline int refuse(Response* r, const char* why) noexcept:
    r.error = why
    return 0


cdef bint token_list_has(const unsigned char* s, Py_ssize_t start, Py_ssize_t end, const char* lower) noexcept:
    """Whether a comma-separated header value holds the token ``lower`` (any case, spaces around)."""
    cdef Py_ssize_t i = start, a, b
    while i <= end:
        a = i
        while i < end and s[i] != 44:
            i += 1
        b = i
        while a < b and (s[a] == 32 or s[a] == 9):
            a += 1
        while b > a and (s[b - 1] == 32 or s[b - 1] == 9):
            b -= 1
        if same_lower(s + a, b - a, lower):
            return True
        i += 1
    return False


cdef int parse_response(const unsigned char* s, Py_ssize_t length, Response* r) noexcept:
    """A whole response head ``s[:length]`` (through its blank line): 1 read, or 0 with ``r.error``."""
    cdef Py_ssize_t i, line, cr, colon, value, end, n
    cdef Field* f
    r.length, r.nfields, r.error = length, 0, NULL
    r.content_length = r.content_length_end = -1
    r.body = r.chunked = r.close = r.keep = 0
    if length < 14 or memcmp(s, b"HTTP/1.", 7) != 0 or (s[7] != 49 and s[7] != 48) or s[8] != 32:
        return refuse(r, "not an HTTP/1.x status line")
    r.http10 = s[7] == 48
    if not (48 <= s[9] <= 57 and 48 <= s[10] <= 57 and 48 <= s[11] <= 57):
        return refuse(r, "a status that is not three digits")
    r.status = (s[9] - 48) * 100 + (s[10] - 48) * 10 + (s[11] - 48)
    if r.status < 100:
        return refuse(r, "a status below 100")
    if s[12] != 32 and s[12] != 13:
        return refuse(r, "a status that is not three digits")
    i = 12
    if s[i] == 32:
        i += 1
    r.reason = i
    while s[i] != 13:
        if not VALUE[s[i]]:
            return refuse(r, "a byte not allowed in the reason phrase")
        i += 1
    r.reason_end = i
    if s[i + 1] != 10:
        return refuse(r, "a CR without LF")
    line = i + 2
    while line < length - 2:
        cr = line
        while s[cr] != 13:
            cr += 1
        if s[cr + 1] != 10:
            return refuse(r, "a CR without LF")
        i = line
        while i < cr and TCHAR[s[i]]:
            i += 1
        if i == line or i == cr or s[i] != 58:
            return refuse(r, "an invalid header field name")
        colon = i
        i += 1
        while i < cr and (s[i] == 32 or s[i] == 9):
            i += 1
        value = i
        while i < cr:
            if not VALUE[s[i]]:
                return refuse(r, "a byte not allowed in a header value")
            i += 1
        end = cr
        while end > value and (s[end - 1] == 32 or s[end - 1] == 9):  # llhttp keeps these; they are no value
            end -= 1
        n = colon - line
        if same_lower(s + line, n, b"content-length"):
            if r.content_length >= 0:
                return refuse(r, "two Content-Length fields")
            if end == value or end - value > MAX_DIGITS:
                return refuse(r, "an invalid Content-Length")
            r.body = 0
            for i in range(value, end):
                if not 48 <= s[i] <= 57:
                    return refuse(r, "an invalid Content-Length")
                r.body = r.body * 10 + (s[i] - 48)
            r.content_length, r.content_length_end = value, cr  # relayed as llhttp reads it: trailing spaces kept
        else:
            if r.nfields >= MAX_FIELDS:
                return refuse(r, "too many header fields")
            f = &r.fields[r.nfields]
            r.nfields += 1
            f.name, f.colon, f.value, f.end, f.kept = line, colon, value, cr, 1
            if same_lower(s + line, n, b"transfer-encoding"):
                if r.chunked or not same_lower(s + value, end - value, b"chunked"):
                    return refuse(r, "a Transfer-Encoding other than chunked")
                r.chunked = 1
            elif same_lower(s + line, n, b"connection"):
                if token_list_has(s, value, end, b"close"):
                    r.close = 1
                if token_list_has(s, value, end, b"keep-alive"):
                    r.keep = 1
        line = cr + 2
    if r.chunked and r.content_length >= 0:
        return refuse(r, "both Content-Length and Transfer-Encoding")
    if r.http10 and not r.keep:
        r.close = 1
    return 1


# --- the parsers as Python sees them: tests/test_lane_parse.py holds them against llhttp ---

def read_request_head(bytes data, tuple names=()):
    """``parse_request`` over ``data`` fed one byte at a time and whole: ``"incomplete"``, the W_ reason's
    name, or what the lane would forward (method, target, the forwarded fields, the key values, the body's
    length, the head's length). Both feeds must agree."""
    cdef Head whole, trickled
    cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef const char* keys[MAX_NAMES]
    cdef Py_ssize_t sizes[MAX_NAMES]
    cdef Py_ssize_t i, n = len(data)
    cdef int count = len(names), a, b = P_INCOMPLETE
    if count > MAX_NAMES:
        raise ValueError(f"at most {MAX_NAMES} key names")
    for i in range(count):
        keys[i], sizes[i] = PyBytes_AS_STRING(names[i]), len(names[i])
    head_reset(&whole)
    head_reset(&trickled)
    a = parse_request(s, n, &whole, keys, sizes, count)
    for i in range(1, n + 1):
        b = parse_request(s, i, &trickled, keys, sizes, count)
        if b != P_INCOMPLETE:
            break
    if a != b or (a == P_SIMPLE and whole.length != trickled.length):  # (a reason may differ: what is seen first)
        raise AssertionError(f"fed whole: {a} ({whole.why}), fed a byte at a time: {b} ({trickled.why})")
    if a == P_INCOMPLETE:
        return "incomplete"
    if a == P_OTHER:
        return HANDOVER_REASONS[whole.why]
    fields = [(data[f.name:f.colon], data[f.value:f.end]) for f in whole.fields[:whole.nfields] if f.kept]
    keyed = [data[whole.key[i]:whole.key_end[i]] if whole.key[i] >= 0 else None for i in range(count)]
    return {"method": b"POST" if whole.post else b"GET", "target": data[whole.target:whole.target_end],
            "path": data[whole.target:whole.path_end], "fields": fields, "keys": keyed,
            "body": whole.body if whole.has_length else None, "length": whole.length}


def read_response_head(bytes data):
    """``parse_response`` over a whole head (through its blank line): the refusal's words, or what the relay
    reads of it (status, reason, fields but Content-Length, its value, chunked, close)."""
    cdef Response r
    cdef Py_ssize_t end = head_end(<const unsigned char*>PyBytes_AS_STRING(data), 0, len(data))
    if end != len(data):
        raise ValueError("not one whole head")
    if not parse_response(<const unsigned char*>PyBytes_AS_STRING(data), end, &r):
        return r.error.decode()
    return {"status": r.status, "reason": data[r.reason:r.reason_end],
            "fields": [(data[f.name:f.colon], data[f.value:f.end]) for f in r.fields[:r.nfields]],
            "length": data[r.content_length:r.content_length_end] if r.content_length >= 0 else None,
            "chunked": bool(r.chunked), "close": bool(r.close)}
