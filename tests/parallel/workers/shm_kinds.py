"""The kind of commlib's shared segments this rank maps, from /proc/self/maps:
"unnamed" (memfd_create: "/memfd:commlib (deleted)"), "named" (the fallback:
"/dev/shm/commlib.* (deleted)"), and their bytes."""


def segments():
    """{kind: bytes mapped} of commlib's shared segments in this process."""
    found = {}
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) < 6:
                continue
            path = fields[5].strip()
            kind = ("unnamed" if path.startswith("/memfd:commlib") else
                    "named" if path.startswith("/dev/shm/commlib.") else None)
            if kind:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                found[kind] = found.get(kind, 0) + end - start
    return found
