# The lane's reader of a client's request head (included by _lane.pyx), strict and narrow. It works on a C
# buffer with an explicit length and never reads past it.
#
# It accepts only what it can forward exactly as the Python path would: ``GET`` or ``POST``,
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
    MAX_HEAD = 65536    # connection/client.py MAX_HEAD
    MAX_FIELDS = 100    # connection/client.py MAX_HEADERS
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
    """``name: value``: one field of the head, sorted as ``connection/client.py``'s ``on_header`` sorts it."""
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
