"""Handshake variants through libnbd: EXPORT_NAME (with and without zero padding), GO,
INFO, LIST, ABORT, STRUCTURED_REPLY on/off, LIST_META_CONTEXT, SET_META_CONTEXT, block
sizes, full info, default and named exports, unknown exports."""

import nbd

from nbdtest import EXPORT_SIZES, HOST, PORT, check, connect, finish, handle, pattern, uri


@check("fixed newstyle + GO + structured replies + base:allocation by default")
def _():
    h = connect("mem")
    assert h.get_protocol() == "newstyle-fixed", h.get_protocol()
    assert h.get_structured_replies_negotiated()
    assert h.can_meta_context("base:allocation")
    assert h.get_size() == EXPORT_SIZES["mem"]
    assert h.can_df() and h.can_flush() and h.can_fua() and h.can_trim() and h.can_zero()
    assert h.can_fast_zero() and h.can_cache() and h.can_multi_conn() and not h.is_read_only()
    h.shutdown()


@check("EXPORT_NAME without fixed newstyle: 124 zero bytes follow the flags")
def _():
    h = handle()
    h.set_handshake_flags(0)
    h.connect_uri(uri("mem"))
    assert h.get_protocol() == "newstyle", h.get_protocol()
    assert not h.get_structured_replies_negotiated()
    assert h.get_size() == EXPORT_SIZES["mem"]
    h.pwrite(pattern(1, 4096), 8192)
    assert h.pread(4096, 8192) == pattern(1, 4096)
    h.shutdown()


@check("EXPORT_NAME with NO_ZEROES: no padding")
def _():
    h = handle()
    h.set_handshake_flags(nbd.HANDSHAKE_FLAG_NO_ZEROES)
    h.connect_uri(uri("ro"))
    assert h.get_protocol() == "newstyle"
    assert h.get_size() == EXPORT_SIZES["ro"] and h.is_read_only()
    assert h.pread(512, 0) == pattern(9, 512)
    h.shutdown()


@check("empty export name reaches the default (first) export, GO and EXPORT_NAME")
def _():
    h = connect("")
    assert h.get_size() == EXPORT_SIZES["mem"]
    h.shutdown()
    h = handle()
    h.set_handshake_flags(0)
    h.connect_tcp(HOST, str(PORT))
    assert h.get_size() == EXPORT_SIZES["mem"]
    h.shutdown()


@check("every named export has its own size and flags")
def _():
    for name, size in EXPORT_SIZES.items():
        h = connect(name)
        assert h.get_size() == size, (name, h.get_size())
        assert h.is_read_only() == (name == "ro"), name
        h.shutdown()


@check("unknown export: GO fails with ERR_UNKNOWN, the option phase continues")
def _():
    h = handle(opt_mode=True)
    h.set_export_name("nope")
    h.connect_tcp(HOST, str(PORT))
    try:
        h.opt_go()
    except nbd.Error:
        pass
    else:
        raise AssertionError("GO to an unknown export succeeded")
    try:
        h.opt_info()
    except nbd.Error:
        pass
    else:
        raise AssertionError("INFO on an unknown export succeeded")
    h.set_export_name("aligned")
    h.opt_go()
    assert h.get_size() == EXPORT_SIZES["aligned"]
    h.shutdown()


@check("LIST returns every export with its description")
def _():
    h = handle(opt_mode=True)
    h.connect_tcp(HOST, str(PORT))
    seen = {}
    count = h.opt_list(lambda name, desc: seen.__setitem__(name, desc))
    assert count == len(EXPORT_SIZES), count
    assert set(seen) == set(EXPORT_SIZES), seen
    assert seen["mem"] == "the main test disk", seen
    assert seen["ro"] != ""
    h.opt_abort()


@check("INFO then GO: same answers; INFO does not enter transmission")
def _():
    h = handle(opt_mode=True)
    h.set_export_name("ro")
    h.connect_tcp(HOST, str(PORT))
    h.opt_info()
    assert h.get_size() == EXPORT_SIZES["ro"] and h.is_read_only()
    assert h.aio_is_negotiating()
    h.set_export_name("mem")
    h.opt_info()
    info_size = h.get_size()
    h.opt_go()
    assert h.get_size() == info_size == EXPORT_SIZES["mem"]
    assert h.aio_is_ready()
    h.shutdown()


@check("ABORT is acknowledged and ends the session")
def _():
    h = handle(opt_mode=True)
    h.connect_tcp(HOST, str(PORT))
    h.opt_abort()
    assert h.aio_is_closed() or h.aio_is_dead()


@check("full info: canonical name and description")
def _():
    h = handle()
    h.set_full_info(True)
    h.connect_uri(uri(""))
    assert h.get_canonical_export_name() == "mem", h.get_canonical_export_name()
    assert h.get_export_description() == "the main test disk"
    h.shutdown()


@check("block sizes: minimum, preferred (stripe width's power of two), maximum")
def _():
    h = handle()
    h.set_request_block_size(True)
    h.connect_uri(uri("aligned"))
    sizes = [h.get_block_size(t) for t in (nbd.SIZE_MINIMUM, nbd.SIZE_PREFERRED, nbd.SIZE_MAXIMUM)]
    assert sizes == [4096, 64 * 1024, 64 << 20], sizes
    h.shutdown()
    h = connect("mem")
    assert [h.get_block_size(t) for t in (0, 1, 2)] == [1, 4096, 64 << 20]
    h.shutdown()


@check("structured replies refused by the client: simple replies, no DF, no meta context")
def _():
    h = connect("mem", structured=False)
    assert not h.get_structured_replies_negotiated()
    assert not h.can_df()
    assert not h.can_meta_context("base:allocation")
    h.pwrite(pattern(3, 65536), 0)
    assert h.pread(65536, 0) == pattern(3, 65536)
    h.shutdown()


@check("LIST_META_CONTEXT: all contexts for an empty query, base:allocation on request, nothing else")
def _():
    for queries, expected in (([], ["base:allocation"]), (["base:allocation"], ["base:allocation"]),
                              (["base:"], ["base:allocation"]), (["x-nope:thing"], [])):
        h = handle(meta=False, opt_mode=True)
        for q in queries:
            h.add_meta_context(q)
        h.set_export_name("mem")
        h.connect_tcp(HOST, str(PORT))
        found = []
        count = h.opt_list_meta_context(lambda name: found.append(name))
        assert count == len(expected) and found == expected, (queries, found)
        h.opt_abort()


@check("SET_META_CONTEXT with an unknown context selects nothing")
def _():
    h = handle(meta=False)
    h.add_meta_context("x-unknown:ctx")
    h.connect_uri(uri("mem"))
    assert not h.can_meta_context("base:allocation")
    assert not h.can_meta_context("x-unknown:ctx")
    h.shutdown()


@check("many options in one session, then GO")
def _():
    h = handle(opt_mode=True)
    h.set_export_name("file")
    h.connect_tcp(HOST, str(PORT))
    for _ in range(20):
        h.opt_list(lambda name, desc: 0)
        h.opt_info()
        h.opt_list_meta_context(lambda name: 0)
    h.opt_go()
    assert h.get_size() == EXPORT_SIZES["file"]
    h.shutdown()


finish()
