# The lane's readers of what a replica sends (included by _lane.pyx): its response head, read whole, and a
# chunked body's framing, read byte by byte as it comes. Both work on C buffers with explicit lengths and never
# read past them; what they refuse, the relay answers as the Python path does (a 502 naming it).

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


# --- a chunked body: the framing read byte by byte, the data handed back in spans ---

cdef enum:
    C_SIZE = 0
    C_EXTENSION = 1
    C_SIZE_LF = 2
    C_DATA = 3
    C_DATA_CR = 4
    C_DATA_LF = 5
    C_TRAILER = 6      # at the start of a trailer line, or of the final blank line
    C_TRAILER_NAME = 7
    C_TRAILER_VALUE = 8
    C_TRAILER_LF = 9
    C_END_LF = 10
    MAX_CHUNK_DIGITS = 15
    # what ``dechunk`` found
    CH_MORE = 0        # every byte was used: call again with the next read
    CH_DATA = 1        # a piece of a chunk's data
    CH_END = 2         # the body's end: its last chunk and trailers (read and dropped)
    CH_BAD = 3         # framing llhttp refuses too: ``Chunks.error`` says what


cdef struct Chunks:
    int state
    int digits            # of the chunk's size
    int part              # bytes of the chunk extension's name or value being read
    long long remaining   # bytes left of the chunk being read
    const char* error


cdef inline void chunks_reset(Chunks* c) noexcept:
    c.state, c.digits, c.part, c.remaining, c.error = C_SIZE, 0, 0, 0, NULL


cdef inline int _hex(unsigned char c) noexcept:
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


cdef inline int bad(Chunks* c, const char* why) noexcept:
    c.error = why
    return CH_BAD


cdef int dechunk(Chunks* c, const unsigned char* s, Py_ssize_t size, Py_ssize_t* used, Py_ssize_t* at,
                 Py_ssize_t* length) noexcept:
    """Read the framing of ``s[*used:size]`` on from where ``c`` stopped: CH_DATA with a piece of data at ``*at``,
    ``*length`` bytes; CH_END after the body's last byte; CH_BAD; or CH_MORE once every byte is used. ``*used``
    moves past what was read (a data piece included)."""
    cdef Py_ssize_t i = used[0], take
    cdef unsigned char b
    cdef int digit
    while i < size:
        if c.state == C_DATA:
            take = size - i if size - i < c.remaining else c.remaining
            at[0], length[0] = i, take
            c.remaining -= take
            if c.remaining == 0:
                c.state = C_DATA_CR
            used[0] = i + take
            return CH_DATA
        b = s[i]
        i += 1
        if c.state == C_SIZE:
            digit = _hex(b)
            if digit >= 0 and c.digits < MAX_CHUNK_DIGITS:
                c.remaining = c.remaining * 16 + digit
                c.digits += 1
            elif c.digits and b == 59:  # ';' a chunk extension (llhttp refuses spaces before it)
                c.state, c.part = C_EXTENSION, 0
            elif c.digits and b == 13:
                c.state = C_SIZE_LF
            else:
                return bad(c, "an invalid chunk size")
        elif c.state == C_EXTENSION:  # ;name=value;...: tokens, none empty (a quoted value is refused, as a space is)
            if TCHAR[b]:
                c.part += 1
            elif c.part and (b == 59 or b == 61 or b == 13):
                c.part = 0
                if b == 13:
                    c.state = C_SIZE_LF
            else:
                return bad(c, "an invalid chunk extension")
        elif c.state == C_SIZE_LF:
            if b != 10:
                return bad(c, "a chunk size line without LF")
            c.digits = 0
            c.state = C_DATA if c.remaining else C_TRAILER
        elif c.state == C_DATA_CR:
            if b != 13:
                return bad(c, "a chunk's data not followed by CRLF")
            c.state = C_DATA_LF
        elif c.state == C_DATA_LF:
            if b != 10:
                return bad(c, "a chunk's data not followed by CRLF")
            c.state = C_SIZE
        elif c.state == C_TRAILER:  # a trailer field is read as a head's and dropped (bounded by the relay: ``bare``)
            if b == 13:
                c.state = C_END_LF
            elif TCHAR[b]:
                c.state = C_TRAILER_NAME
            else:
                return bad(c, "an invalid trailer")
        elif c.state == C_TRAILER_NAME:
            if b == 58:
                c.state = C_TRAILER_VALUE
            elif not TCHAR[b]:
                return bad(c, "an invalid trailer")
        elif c.state == C_TRAILER_VALUE:
            if b == 13:
                c.state = C_TRAILER_LF
            elif not VALUE[b]:
                return bad(c, "an invalid trailer")
        elif c.state == C_TRAILER_LF:
            if b != 10:
                return bad(c, "a trailer without LF")
            c.state = C_TRAILER
        elif c.state == C_END_LF:
            if b != 10:
                return bad(c, "a chunked body's last line without LF")
            used[0] = i
            return CH_END
    used[0] = i
    return CH_MORE
