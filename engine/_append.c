/* oncelog._append: a client append in one C call.
 *
 * The Python append path (oncelog.log, oncelog.validation, oncelog.append_rules,
 * oncelog.producer_state, oncelog.segments.segment) is the reference; this module
 * does the same work for the common case in one call under the GIL and the log's
 * lock: the header checks, the CRC-32C, the record walk, Kafka's producer rules
 * against the numpy producer table, the offset stamp, the copy into the mapped
 * segment, the index entries and the producer rows.
 *
 * Each rule and its two implementations (C here, Python the reference):
 *
 *   rule                                   C                      Python
 *   batch header checks (size, magic,      check_batch            oncelog.validation.client_batch_header
 *     CRC, counts, pid/sequence)
 *   record framing walk                    walk_records           oncelog.segments.records.check_records
 *   pid -> producer table slot             probe                  oncelog.pid_map.PidSlotMap._probe
 *   sequence and epoch checks, duplicates  check_producer         oncelog.append_rules.ProducerAppendInfo.check
 *   producer state after a data batch      apply_producer         oncelog.append_rules.apply_batch
 *   sequence wraparound (MAX -> 0)         in_sequence            oncelog.producer_state.in_sequence
 *   segment roll                           roll_needed            oncelog.log_appends.roll_needed
 *   a request's steps (append_request):
 *     check every batch                    check_request          oncelog.validation.validate_batch
 *     plan offsets and producer rules      plan_request           oncelog.log_appends.LogAppends._plan
 *     reserve room and index entries       reserve_room           oncelog.segments.segment.LogSegment._index_batch
 *     write the bytes                      write_request          oncelog.segments.segment.LogSegment.append
 *     publish indexes, cursor, producers   publish_request        oncelog.log_appends.LogAppends._publish
 *     track the transactions it opens      track_opened           oncelog.transactions.OpenTransactions.track
 *
 * It never decides anything the Python path would decide differently. Anything
 * it does not handle (a refusal of any kind, compression, record headers, a roll,
 * expiry due, a full table, no mapped room) returns None
 * before any state changed, and the caller runs the Python path from scratch,
 * which then raises or appends as the reference does. So every error message and
 * every rare case lives in one place, in Python.
 *
 * State is shared, not copied: the segment, its indexes, the producer ring and the
 * pid map keep their scalars in small int64 arrays (the layouts are in
 * oncelog.segments.cursor and oncelog.storage.producer_row; LAYOUT below is checked
 * against them by the tests), so both implementations read and write the same
 * memory and may take turns on one log. Mapped files are reached through the
 * address their owner stores in its cursor while the mapping exists (0 when it
 * does not); every address is re-read after the last call into Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the producer table is read in place as little-endian"
#endif

/* ---- layouts (the Python side owns them; LAYOUT exports these for a test) ---- */
enum { SEG_WRITE_ADDR, SEG_MAPPED_BYTES, SEG_SIZE, SEG_NEXT_OFFSET, SEG_FIRST_BATCH_TS, SEG_MAX_TS,
       SEG_OFFSET_OF_MAX_TS, SEG_BYTES_SINCE_INDEX, SEG_INDEX_INTERVAL, SEG_LAST_OFFSET_LIMIT,
       SEG_UNFLUSHED, SEG_BASE_OFFSET, SEG_HAS_FIRST_TS, SEG_WRITE_FD, SEG_POPULATED, SEG_FIELDS };
enum { IDX_ADDR, IDX_ENTRIES, IDX_CAPACITY, IDX_MAX_ENTRIES, IDX_LAST_FIRST, IDX_LAST_SECOND, IDX_FIELDS };
enum { RING_HEAD, RING_USED, RING_HOLES, RING_EXPIRATION_MS, RING_FIELDS };
enum { MAP_COUNT, MAP_TOMBSTONES, MAP_BUCKETS, MAP_FIELDS };

/* The producer row (oncelog.storage.producer_row.PRODUCER_DTYPE), byte offsets. */
#define WINDOW 5
#define ROW_BYTES 160
#define R_PID 0
#define R_APPEND_MS 8
#define R_TIMESTAMP_MS 16
#define R_TXN_FIRST 24
#define R_COORDINATOR_EPOCH 32
#define R_EPOCH 36
#define R_COUNT 38
#define R_LIVE 39
#define R_LAST_SEQ 40
#define R_LAST_OFFSET 60
#define R_DELTA 100
#define R_MAX_TS 120

/* The batch header (Kafka's v2 record batch), big-endian: oncelog.segments.format's
 * *_OFFSET names, which LAYOUT exports for a test to compare. */
#define H_BASE_OFFSET 0
#define H_LENGTH 8
#define H_LEADER_EPOCH 12
#define H_MAGIC 16
#define H_CRC 17
#define H_ATTRIBUTES 21
#define H_LAST_OFFSET_DELTA 23
#define H_BASE_TIMESTAMP 27
#define H_MAX_TIMESTAMP 35
#define H_PRODUCER_ID 43
#define H_PRODUCER_EPOCH 51
#define H_BASE_SEQUENCE 53
#define H_RECORDS_COUNT 57
#define MAGIC_V2 2
#define HEADER_SIZE 61
#define LOG_OVERHEAD 12
#define PREFIX_BYTES 17 /* base offset, length, leader epoch, magic: no CRC covers them */
#define CRC_START 21
#define COMPRESSION_AND_CONTROL 0x27
#define TIMESTAMP_TYPE_MASK 0x08
#define TRANSACTIONAL_MASK 0x10
#define INT32_MAX_SEQ 2147483647LL
#define MAX_OFFSET (INT64_MAX - 1)
#define MAX_DUE_S 4294967295LL
#define MAX_OCCUPIED_LOAD 0.85
#define FIB_MULTIPLIER 0x9E3779B97F4A7C15ULL /* oncelog.pid_map's hash: multiply, then xor-shift */
#define HASH_SHIFT 29
#define MAP_EMPTY 0
#define MAP_TOMBSTONE 1
/* A request of more batches than this goes to the Python path (a Kafka produce
 * request carries one batch per partition). */
#define MAX_BATCHES 64
/* Writes of at least this many bytes go to pwrite() (segments.segment.WRITE_SYSCALL_MIN_BYTES):
 * a write() fills fresh page cache faster than page faults on a mapping do. */
#define WRITE_SYSCALL_MIN_BYTES 8192
/* The mapping is faulted in this far ahead of the writes, in one madvise: a page fault
 * per 4 KiB page costs more than the copies into it (measured: 10 x 170 B requests took
 * 2.1 us with a fault per page, 0.8 us populated ahead). At most this much of an active
 * segment is zeros in the page cache ahead of its data. */
#define POPULATE_AHEAD_BYTES (256 * 1024)
/* Requests this large are checked with the GIL let go. */
#define RELEASE_GIL_BYTES (64 * 1024)

/* ---- CRC-32C (Castagnoli, reflected 0x82F63B78) ---------------------------------
 * SSE4.2's crc32 instruction where the CPU has it, three streams at a time (the
 * instruction's latency is three cycles, its throughput one), joined by shifting
 * a stream's register over the zeros of the streams after it. Slice-by-8 tables
 * elsewhere. */
#define CRC_POLY 0x82F63B78u
static uint32_t crc_slices[8][256];
/* shift_*[k][b]: the register b << 8k becomes after this many zero bytes. */
#define LONG_BLOCK 4096
#define SHORT_BLOCK 256
static uint32_t shift_long[4][256];
static uint32_t shift_short[4][256];
static int have_sse42;

static uint32_t crc_software(uint32_t crc, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_slices[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        word ^= crc;
        crc = crc_slices[7][word & 0xff] ^ crc_slices[6][(word >> 8) & 0xff] ^
              crc_slices[5][(word >> 16) & 0xff] ^ crc_slices[4][(word >> 24) & 0xff] ^
              crc_slices[3][(word >> 32) & 0xff] ^ crc_slices[2][(word >> 40) & 0xff] ^
              crc_slices[1][(word >> 48) & 0xff] ^ crc_slices[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_slices[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

static uint32_t apply_shift(uint32_t table[4][256], uint32_t crc) {
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
}

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc_one_stream(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}

__attribute__((target("sse4.2"))) static uint32_t crc_three_streams(
    uint32_t crc, const uint8_t *p, size_t n, size_t block, uint32_t table[4][256]) {
    while (n >= 3 * block) {
        uint64_t a = crc, b = 0, c = 0;
        const uint8_t *end = p + block;
        do {
            uint64_t x, y, z;
            memcpy(&x, p, 8);
            memcpy(&y, p + block, 8);
            memcpy(&z, p + 2 * block, 8);
            a = _mm_crc32_u64(a, x);
            b = _mm_crc32_u64(b, y);
            c = _mm_crc32_u64(c, z);
            p += 8;
        } while (p < end);
        crc = apply_shift(table, (uint32_t)a) ^ (uint32_t)b;
        crc = apply_shift(table, crc) ^ (uint32_t)c;
        p += 2 * block;
        n -= 3 * block;
    }
    return crc_one_stream(crc, p, n);
}

/* Folding with carry-less multiplies (AVX-512 VPCLMULQDQ), for long inputs: about twice
 * the crc32 instruction's 8 bytes a cycle. With the register's bits as polynomial
 * coefficients (bit i of a 16-byte lane, loaded little-endian, is x^(127-i), as the
 * reflected CRC reads bytes), a lane moves d bits further along the message by
 * multiplying its high-degree half by x^(64+d) mod P and its low-degree half by x^d mod P
 * (the sum is congruent mod P, at most 96 bits, and XORs onto the lane d bits on). The
 * constants hold those residues with one factor x moved into the multiply's bit order:
 * fold_k[d] = (bitrev64(x^(63+d) mod P), bitrev64(x^(d-1) mod P)). What is left after the
 * folds, one 16-byte lane and a tail under 16 bytes, is a message the crc32 instruction
 * finishes from a zero register (the starting register is XORed into the first bytes). */
#define FOLD_MIN_BYTES 256
enum { FOLD_128, FOLD_256, FOLD_384, FOLD_512, FOLD_1024, FOLD_1536, FOLD_2048, FOLD_DISTANCES };
static const int fold_bits[FOLD_DISTANCES] = {128, 256, 384, 512, 1024, 1536, 2048};
static uint64_t fold_k[FOLD_DISTANCES][2];
static int have_vpclmul;    /* AVX-512 VPCLMULQDQ: four 512-bit registers */
static int have_vpclmul256; /* VPCLMULQDQ on AVX2 only (AMD Zen 3, say): four 256-bit registers */

static uint64_t x_power_mod_p(int e) { /* x^e mod P, bit i the coefficient of x^i */
    uint64_t r = 1;
    while (e--) {
        r <<= 1;
        if (r >> 32) r ^= 0x11EDC6F41ull; /* P, not reflected */
    }
    return r;
}

static uint64_t bit_reverse64(uint64_t v) {
    uint64_t r = 0;
    for (int i = 0; i < 64; i++, v >>= 1) r = (r << 1) | (v & 1);
    return r;
}

static void init_fold_constants(void) {
    for (int i = 0; i < FOLD_DISTANCES; i++) {
        fold_k[i][0] = bit_reverse64(x_power_mod_p(63 + fold_bits[i]));
        fold_k[i][1] = bit_reverse64(x_power_mod_p(fold_bits[i] - 1));
    }
}

/* One 16-byte lane moved on by 128 bits, XORed onto `next`: the last step of both folds. */
#define LANE_TARGET __attribute__((target("pclmul,sse4.2")))
LANE_TARGET static inline __m128i fold_lane(__m128i lane, __m128i next) {
    const __m128i k128 = _mm_set_epi64x((long long)fold_k[FOLD_128][1], (long long)fold_k[FOLD_128][0]);
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(lane, k128, 0x00), _mm_clmulepi64_si128(lane, k128, 0x11)),
                         next);
}

/* What both folds leave, one lane and a tail of `n` bytes at `p`, folded 16 bytes at a time and
 * finished by the crc32 instruction from a zero register. */
LANE_TARGET static uint32_t fold_finish(__m128i lane, const uint8_t *p, size_t n) {
    for (; n >= 16; p += 16, n -= 16) lane = fold_lane(lane, _mm_loadu_si128((const __m128i *)p));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(lane));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(lane, 1));
    return crc_one_stream((uint32_t)c, p, n);
}

#define FOLD_TARGET __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))
FOLD_TARGET static inline __m512i fold_k4(int distance) {
    return _mm512_broadcast_i32x4(_mm_set_epi64x((long long)fold_k[distance][1], (long long)fold_k[distance][0]));
}

/* Each 16-byte lane of `acc` moved on by the constants' distance, XORed onto `next`. */
FOLD_TARGET static inline __m512i fold_onto(__m512i acc, __m512i k, __m512i next) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00), _mm512_clmulepi64_epi128(acc, k, 0x11),
                                     next, 0x96);
}

FOLD_TARGET static uint32_t crc_folded(uint32_t crc, const uint8_t *p, size_t n) {
    assert(n >= FOLD_MIN_BYTES);
    __m512i a0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc)));
    __m512i a1 = _mm512_loadu_si512(p + 64), a2 = _mm512_loadu_si512(p + 128), a3 = _mm512_loadu_si512(p + 192);
    p += 256;
    n -= 256;
    const __m512i k2048 = fold_k4(FOLD_2048);
    for (; n >= 256; p += 256, n -= 256) {
        a0 = fold_onto(a0, k2048, _mm512_loadu_si512(p));
        a1 = fold_onto(a1, k2048, _mm512_loadu_si512(p + 64));
        a2 = fold_onto(a2, k2048, _mm512_loadu_si512(p + 128));
        a3 = fold_onto(a3, k2048, _mm512_loadu_si512(p + 192));
    }
    /* Four registers into the last one, then 64 bytes at a time. */
    __m512i acc = fold_onto(a2, fold_k4(FOLD_512), a3);
    acc = fold_onto(a1, fold_k4(FOLD_1024), acc);
    acc = fold_onto(a0, fold_k4(FOLD_1536), acc);
    const __m512i k512 = fold_k4(FOLD_512);
    for (; n >= 64; p += 64, n -= 64) acc = fold_onto(acc, k512, _mm512_loadu_si512(p));
    /* Four lanes into the last one: lanes 0-2 move on by 384, 256 and 128 bits. */
    const __m512i k_lanes = _mm512_set_epi64(0, 0, (long long)fold_k[FOLD_128][1], (long long)fold_k[FOLD_128][0],
                                             (long long)fold_k[FOLD_256][1], (long long)fold_k[FOLD_256][0],
                                             (long long)fold_k[FOLD_384][1], (long long)fold_k[FOLD_384][0]);
    __m512i moved = _mm512_xor_si512(_mm512_clmulepi64_epi128(acc, k_lanes, 0x00), _mm512_clmulepi64_epi128(acc, k_lanes, 0x11));
    __m128i lane = _mm_xor_si128(_mm_xor_si128(_mm512_extracti32x4_epi32(moved, 0), _mm512_extracti32x4_epi32(moved, 1)),
                                 _mm_xor_si128(_mm512_extracti32x4_epi32(moved, 2), _mm512_extracti32x4_epi32(acc, 3)));
    return fold_finish(lane, p, n);
}

/* The same folds on four 256-bit registers, for CPUs with VPCLMULQDQ but no AVX-512:
 * 128 bytes a step (each lane moved on by 1024 bits), the registers folded one onto the
 * next by 256 bits, 32 bytes at a time, then the two lanes into one. */
#define FOLD256_TARGET __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.2")))
FOLD256_TARGET static inline __m256i fold_k2(int distance) {
    return _mm256_broadcastsi128_si256(_mm_set_epi64x((long long)fold_k[distance][1], (long long)fold_k[distance][0]));
}

FOLD256_TARGET static inline __m256i fold_onto256(__m256i acc, __m256i k, __m256i next) {
    return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(acc, k, 0x00), _mm256_clmulepi64_epi128(acc, k, 0x11)),
                            next);
}

FOLD256_TARGET static uint32_t crc_folded256(uint32_t crc, const uint8_t *p, size_t n) {
    assert(n >= FOLD_MIN_BYTES);
    const __m256i *v = (const __m256i *)p;
    __m256i a0 = _mm256_xor_si256(_mm256_loadu_si256(v), _mm256_zextsi128_si256(_mm_cvtsi32_si128((int)crc)));
    __m256i a1 = _mm256_loadu_si256(v + 1), a2 = _mm256_loadu_si256(v + 2), a3 = _mm256_loadu_si256(v + 3);
    p += 128;
    n -= 128;
    const __m256i k1024 = fold_k2(FOLD_1024);
    for (; n >= 128; p += 128, n -= 128) {
        v = (const __m256i *)p;
        a0 = fold_onto256(a0, k1024, _mm256_loadu_si256(v));
        a1 = fold_onto256(a1, k1024, _mm256_loadu_si256(v + 1));
        a2 = fold_onto256(a2, k1024, _mm256_loadu_si256(v + 2));
        a3 = fold_onto256(a3, k1024, _mm256_loadu_si256(v + 3));
    }
    const __m256i k256 = fold_k2(FOLD_256);
    __m256i acc = fold_onto256(fold_onto256(fold_onto256(a0, k256, a1), k256, a2), k256, a3);
    for (; n >= 32; p += 32, n -= 32) acc = fold_onto256(acc, k256, _mm256_loadu_si256((const __m256i *)p));
    /* The low lane moves on by 128 bits onto the high one. */
    return fold_finish(fold_lane(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1)), p, n);
}

static uint32_t crc_hardware(uint32_t crc, const uint8_t *p, size_t n) {
    if (have_vpclmul && n >= FOLD_MIN_BYTES) return crc_folded(crc, p, n);
    if (have_vpclmul256 && n >= FOLD_MIN_BYTES) return crc_folded256(crc, p, n);
    if (n >= 3 * LONG_BLOCK) {
        size_t whole = n - n % (3 * LONG_BLOCK);
        crc = crc_three_streams(crc, p, whole, LONG_BLOCK, shift_long);
        p += whole;
        n -= whole;
    }
    return crc_three_streams(crc, p, n, SHORT_BLOCK, shift_short);
}
#endif

/* The CRC register's raw update (no pre- or post-inversion). */
static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n) {
#if defined(__x86_64__)
    if (have_sse42) return crc_hardware(crc, p, n);
#endif
    return crc_software(crc, p, n);
}

static uint32_t crc32c_of(const uint8_t *p, size_t n) { return ~crc_update(0xFFFFFFFFu, p, n); }

static void init_shift_table(uint32_t table[4][256], size_t zeros) {
    /* The shift is linear in the register: find where each of the 32 bits goes, then
     * tabulate every byte of each of the four byte lanes. */
    static uint8_t zero_bytes[LONG_BLOCK];
    uint32_t column[32];
    for (int bit = 0; bit < 32; bit++) column[bit] = crc_software(1u << bit, zero_bytes, zeros);
    for (int lane = 0; lane < 4; lane++) {
        for (int byte = 0; byte < 256; byte++) {
            uint32_t out = 0;
            for (int bit = 0; bit < 8; bit++)
                if (byte & (1 << bit)) out ^= column[lane * 8 + bit];
            table[lane][byte] = out;
        }
    }
}

static void init_crc(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC_POLY : c >> 1;
        crc_slices[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int s = 1; s < 8; s++)
            crc_slices[s][b] = crc_slices[0][crc_slices[s - 1][b] & 0xff] ^ (crc_slices[s - 1][b] >> 8);
    init_shift_table(shift_long, LONG_BLOCK);
    init_shift_table(shift_short, SHORT_BLOCK);
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2") != 0;
    have_vpclmul = have_sse42 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul");
    have_vpclmul256 = have_sse42 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq") &&
                      __builtin_cpu_supports("pclmul");
    init_fold_constants();
#endif
}

/* ---- little helpers -------------------------------------------------------------- */
static inline int64_t be64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)__builtin_bswap64(v);
}
static inline int32_t be32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return (int32_t)__builtin_bswap32(v);
}
static inline int16_t be16(const uint8_t *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }
static inline void put_be64(uint8_t *p, int64_t v) {
    uint64_t x = __builtin_bswap64((uint64_t)v);
    memcpy(p, &x, 8);
}
static inline void put_be32(uint8_t *p, int32_t v) {
    uint32_t x = __builtin_bswap32((uint32_t)v);
    memcpy(p, &x, 4);
}
static inline int64_t le64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline int32_t le32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline void put_le64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }
static inline void put_le32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }

/* ---- the record walk (oncelog.segments.records.check_records, exact=True) -------
 * Stricter, never looser: a record with headers is left to the Python walk, which
 * also checks their keys are UTF-8. */
static int read_varint(const uint8_t *data, Py_ssize_t size, Py_ssize_t *pos, int max_bytes, int64_t *out) {
    uint64_t raw = 0;
    int shift = 0;
    Py_ssize_t at = *pos, end = at + max_bytes;
    for (;;) {
        if (at >= size || at >= end) return 0;
        uint8_t b = data[at++];
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            if (max_bytes == 5 && (raw >> 32)) return 0;
            if (max_bytes == 10 && shift == 63 && b > 1) return 0; /* past 64 bits */
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            *pos = at;
            return 1;
        }
        shift += 7;
    }
}

/* 1 and the largest timestamp delta when data[HEADER_SIZE:] holds exactly `count` records
 * with offset deltas 0..count-1 and no headers; 0 otherwise. */
static int walk_records(const uint8_t *data, Py_ssize_t size, int64_t count, int64_t *max_ts_delta) {
    if (count * 7 > size - HEADER_SIZE) return 0;
    Py_ssize_t pos = HEADER_SIZE;
    int64_t best = INT64_MIN;
    for (int64_t index = 0; index < count; index++) {
        int64_t length, ts_delta, delta, n;
        if (!read_varint(data, size, &pos, 5, &length)) return 0;
        Py_ssize_t end = pos + length;
        if (length <= 0 || end > size) return 0;
        pos += 1; /* the attributes byte */
        if (!read_varint(data, end, &pos, 10, &ts_delta)) return 0;
        if (ts_delta > best) best = ts_delta;
        if (!read_varint(data, end, &pos, 5, &delta) || delta != index) return 0;
        for (int field = 0; field < 2; field++) { /* key, then value */
            if (!read_varint(data, end, &pos, 5, &n) || n < -1) return 0;
            if (n > 0) {
                if (n > end - pos) return 0;
                pos += n;
            }
        }
        if (pos >= end || data[pos] != 0) return 0; /* headers: the Python walk's */
        pos += 1;
        if (pos != end) return 0;
    }
    if (pos != size) return 0;
    *max_ts_delta = count ? best : -1;
    return 1;
}

/* ---- one batch of a request -------------------------------------------------------- */
typedef struct {
    const uint8_t *data;
    Py_ssize_t size;
    int64_t pid, max_ts;
    int32_t last_delta, count, first_seq, last_seq;
    int16_t epoch;
    int transactional;
    /* the plan */
    int duplicate;
    int opens;          /* opens its producer's transaction (the first transactional batch since a marker) */
    int tracked;        /* track_opened added it to the open transactions */
    int64_t base, last; /* a duplicate's: the original's */
    int producer;       /* index into the request's producers, or -1 */
} Batch;

/* One header's checks (oncelog.validation.client_batch_header): 1 when the batch
 * passes every check the Python path makes. */
static int check_batch(Batch *b, int64_t max_batch_bytes) {
    const uint8_t *d = b->data;
    Py_ssize_t size = b->size;
    if (size < HEADER_SIZE || size > max_batch_bytes) return 0;
    if ((int64_t)be32(d + H_LENGTH) + LOG_OVERHEAD != size || d[H_MAGIC] != MAGIC_V2) return 0;
    int16_t attributes = be16(d + H_ATTRIBUTES);
    int32_t last_delta = be32(d + H_LAST_OFFSET_DELTA);
    int32_t count = be32(d + H_RECORDS_COUNT);
    int64_t base_ts = be64(d + H_BASE_TIMESTAMP), max_ts = be64(d + H_MAX_TIMESTAMP), pid = be64(d + H_PRODUCER_ID);
    int32_t base_seq = be32(d + H_BASE_SEQUENCE);
    if (count <= 0 || (int64_t)last_delta + 1 != count) return 0;
    if (attributes & COMPRESSION_AND_CONTROL) return 0; /* compressed: the Python path's */
    if (pid >= 0 && base_seq < 0) return 0;
    if (crc32c_of(d + CRC_START, (size_t)(size - CRC_START)) != (uint32_t)be32(d + H_CRC)) return 0;
    int64_t max_ts_delta, sum;
    if (!walk_records(d, size, count, &max_ts_delta)) return 0;
    /* A header maxTimestamp that is not the records' largest, or a client's LogAppendTime
     * bit: the Python path stores the batch set right (validation.with_records_max_timestamp). */
    if ((attributes & TIMESTAMP_TYPE_MASK) || __builtin_add_overflow(base_ts, max_ts_delta, &sum) || sum != max_ts)
        return 0;
    b->pid = pid;
    b->max_ts = max_ts;
    b->last_delta = last_delta;
    b->count = count;
    b->epoch = be16(d + H_PRODUCER_EPOCH);
    b->first_seq = base_seq;
    b->last_seq = (int32_t)(((int64_t)base_seq + last_delta) % (INT32_MAX_SEQ + 1));
    b->transactional = (attributes & TRANSACTIONAL_MASK) != 0;
    return 1;
}

/* ---- the appender ------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    PyObject *acquire, *release, *clock, *hot, *result_type;
    /* The log's open transactions, producer id -> first offset (OpenTransactions.first_offsets):
     * a batch that opens one is added here, under the lock, before anything is published. */
    PyObject *open_txns;
    Py_buffer table, due, ring, keys, values, bucket_of, map_state, seg, offset_index, time_index;
    /* The wall clock's high mark (oncelog.clock.MonotonicWallClock.cell), when the log's
     * clock is the wall clock: then the time is read here, not by calling the clock. */
    Py_buffer clock_cell;
    /* max_buckets: the keys array's length; the map probes the first MAP_BUCKETS of them. */
    int64_t capacity, max_buckets, max_batch_bytes, segment_bytes, segment_ms;
    int buffers_held; /* how many of the Py_buffers above are held, in declaration order */
    int has_clock_cell;
    int closed; /* set by close(); the buffers are let go of only when the Appender is freed */
} Appender;

#define I64(buffer) ((int64_t *)(buffer).buf)

typedef struct {
    int64_t pid, slot; /* slot -1: new to the table */
    uint8_t row[ROW_BYTES];
} Producer;

static int in_sequence(int64_t last, int64_t next) {
    return next == last + 1 || (next == 0 && last == INT32_MAX_SEQ);
}

static int64_t home_bucket(int64_t pid, int64_t buckets) {
    uint64_t mixed = (uint64_t)pid * FIB_MULTIPLIER;
    return (int64_t)((mixed ^ (mixed >> HASH_SHIFT)) % (uint64_t)buckets);
}

/* oncelog.pid_map.PidSlotMap._probe: the bucket holding `pid` or the empty one ending
 * its run, and the first tombstone on the way (-1 if none). */
static int64_t probe(Appender *self, int64_t pid, int64_t *first_tombstone) {
    const int64_t *keys = I64(self->keys);
    int64_t buckets = I64(self->map_state)[MAP_BUCKETS]; /* (checked by plan_request) */
    int64_t stored = ~pid, i = home_bucket(pid, buckets);
    *first_tombstone = -1;
    for (;;) {
        int64_t key = keys[i];
        if (key == stored || key == MAP_EMPTY) return i;
        if (key == MAP_TOMBSTONE && *first_tombstone < 0) *first_tombstone = i;
        if (++i == buckets) i = 0;
    }
}

/* Kafka's rules (oncelog.append_rules.ProducerAppendInfo.check) on the working row:
 * 1 accept, 2 duplicate (offsets set), 0 anything else (the Python path raises). */
static int check_producer(const Producer *p, const Batch *b, int64_t *first_offset, int64_t *last_offset) {
    if (p->slot < 0 && le64(p->row + R_PID) != p->pid) return 1; /* unknown: any sequence (KIP-360) */
    const uint8_t *row = p->row;
    int16_t stored_epoch;
    memcpy(&stored_epoch, row + R_EPOCH, 2);
    int count = row[R_COUNT];
    if (b->epoch < stored_epoch) return 0;
    if (b->epoch > stored_epoch) {
        if (b->first_seq != 0 && stored_epoch != -1) return 0;
    } else {
        for (int i = 0; i < count; i++) {
            int64_t last_seq = le32(row + R_LAST_SEQ + 4 * i);
            int64_t delta = le32(row + R_DELTA + 4 * i);
            int64_t first_seq = last_seq == -1 ? -1 : (((last_seq - delta) % (INT32_MAX_SEQ + 1)) +
                                                       (INT32_MAX_SEQ + 1)) % (INT32_MAX_SEQ + 1);
            if (first_seq == b->first_seq && last_seq == b->last_seq) {
                *last_offset = le64(row + R_LAST_OFFSET + 8 * i);
                *first_offset = *last_offset - delta;
                return 2;
            }
        }
        int64_t last = count ? le32(row + R_LAST_SEQ + 4 * (count - 1)) : -1;
        if (!in_sequence(last, b->first_seq)) return 0;
    }
    if (le64(row + R_TXN_FIRST) >= 0 && !b->transactional) return 0;
    return 1;
}

/* oncelog.append_rules.apply_batch for a data batch, on the working row. */
static void apply_producer(Producer *p, const Batch *b, int64_t now_ms) {
    uint8_t *row = p->row;
    if (p->slot < 0 && le64(row + R_PID) != p->pid) {
        /* a new producer's row, as ProducerAppendInfo._current_or_new makes it */
        memset(row, 0, ROW_BYTES);
        put_le64(row + R_PID, p->pid);
        put_le64(row + R_TXN_FIRST, -1);
        put_le32(row + R_COORDINATOR_EPOCH, -1);
        memcpy(row + R_EPOCH, &b->epoch, 2);
        row[R_LIVE] = 1;
    }
    put_le64(row + R_APPEND_MS, now_ms);
    int16_t stored_epoch;
    memcpy(&stored_epoch, row + R_EPOCH, 2);
    int count = row[R_COUNT];
    if (b->epoch != stored_epoch) {
        memcpy(row + R_EPOCH, &b->epoch, 2);
        count = 0;
    } else if (count) {
        int64_t last = le32(row + R_LAST_SEQ + 4 * (count - 1));
        if (last != -1 && !in_sequence(last, b->first_seq)) count = 0;
    }
    if (count == WINDOW) { /* drop the oldest */
        memmove(row + R_LAST_SEQ, row + R_LAST_SEQ + 4, 4 * (WINDOW - 1));
        memmove(row + R_LAST_OFFSET, row + R_LAST_OFFSET + 8, 8 * (WINDOW - 1));
        memmove(row + R_DELTA, row + R_DELTA + 4, 4 * (WINDOW - 1));
        memmove(row + R_MAX_TS, row + R_MAX_TS + 8, 8 * (WINDOW - 1));
        count--;
    }
    put_le32(row + R_LAST_SEQ + 4 * count, b->last_seq);
    put_le64(row + R_LAST_OFFSET + 8 * count, b->last);
    put_le32(row + R_DELTA + 4 * count, (int32_t)(b->last - b->base));
    put_le64(row + R_MAX_TS + 8 * count, b->max_ts);
    /* unused window slots stay zero, as the Python row writer pads them */
    for (int i = count + 1; i < WINDOW; i++) {
        put_le32(row + R_LAST_SEQ + 4 * i, 0);
        put_le64(row + R_LAST_OFFSET + 8 * i, 0);
        put_le32(row + R_DELTA + 4 * i, 0);
        put_le64(row + R_MAX_TS + 8 * i, 0);
    }
    row[R_COUNT] = (uint8_t)(count + 1);
    put_le64(row + R_TIMESTAMP_MS, b->max_ts);
}

/* Kafka's roll rules (oncelog.log_appends.roll_needed). */
static int roll_needed(int64_t segment_bytes, int has_first_ts, int64_t first_ts, int64_t incoming, int64_t max_ts,
                       int64_t last, int64_t last_offset_limit, int64_t max_segment_bytes, int64_t segment_ms) {
    if (last > last_offset_limit) return 1;
    if (segment_bytes == 0) return 0;
    if (segment_bytes + incoming > max_segment_bytes) return 1;
    if (!has_first_ts) return 0;
    return (__int128)max_ts - first_ts > segment_ms;
}

typedef struct {
    int64_t first, second; /* an offset entry: relative offset, position; a time entry: timestamp, relative offset */
} Entry;

static Entry last_entry(const int64_t *cursor) {
    Entry e = {cursor[IDX_LAST_FIRST], cursor[IDX_LAST_SECOND]};
    return e;
}

/* Fault in the mapping past `end` once the writes reach the populated edge. Only a hint:
 * a kernel without MADV_POPULATE_WRITE (before 5.14) faults the pages one by one. */
static void populate_ahead(int64_t *seg, uint8_t *view, int64_t end) {
    int64_t from = seg[SEG_POPULATED];
    if (end + PREFIX_BYTES < from) return;
    from = end - end % 4096;
    int64_t to = from + POPULATE_AHEAD_BYTES;
    if (to > seg[SEG_MAPPED_BYTES]) to = seg[SEG_MAPPED_BYTES];
    seg[SEG_POPULATED] = to;
    if (to > from) {
        /* Faulting in 64 pages takes a while: other threads run meanwhile (the mapping
         * stays: only this thread, holding the log's lock, could unmap it). */
        Py_BEGIN_ALLOW_THREADS
        (void)madvise(view + from, (size_t)(to - from), MADV_POPULATE_WRITE);
        Py_END_ALLOW_THREADS
    }
}

/* Write the request's new batches at `position` with their prefixes stamped: 1 when all
 * `total` bytes are written. On an error (a full disk) 0, with nothing else changed: bytes
 * past the segment's size are not part of the log, and the Python path then writes the
 * request again and reports the error as it does. */
static int write_through_fd(const Batch *batches, Py_ssize_t n, int fd, int64_t position, int64_t total) {
    uint8_t prefixes[MAX_BATCHES][PREFIX_BYTES];
    struct iovec iov[2 * MAX_BATCHES];
    int count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Batch *b = &batches[i];
        if (b->duplicate) continue;
        uint8_t *prefix = prefixes[count / 2];
        put_be64(prefix + H_BASE_OFFSET, b->base);
        put_be32(prefix + H_LENGTH, (int32_t)(b->size - LOG_OVERHEAD));
        put_be32(prefix + H_LEADER_EPOCH, -1);
        prefix[16] = 2;
        iov[count].iov_base = prefix;
        iov[count++].iov_len = PREFIX_BYTES;
        iov[count].iov_base = (void *)(b->data + PREFIX_BYTES);
        iov[count++].iov_len = (size_t)(b->size - PREFIX_BYTES);
    }
    int64_t done = 0;
    struct iovec *at = iov;
    int ok = 1;
    /* The GIL is let go for the copy, as os.pwritev lets it go: other threads run on. The
     * log's lock is held, and the batches are pinned by the caller. */
    Py_BEGIN_ALLOW_THREADS
    while (done < total) {
        ssize_t written = pwritev(fd, at, count, (off_t)(position + done));
        if (written < 0 && errno == EINTR) continue;
        if (written <= 0) {
            ok = 0;
            break;
        }
        done += written;
        while (count && (size_t)written >= at->iov_len) { /* a short write: resume after it */
            written -= (ssize_t)at->iov_len;
            at++;
            count--;
        }
        if (count) {
            at->iov_base = (uint8_t *)at->iov_base + written;
            at->iov_len -= (size_t)written;
        }
    }
    Py_END_ALLOW_THREADS
    return ok;
}

/* ---- one request, in the Python path's steps: check, plan, reserve, write, publish ---- */

/* What plan_request decided: each producer's working row, the offsets, the bytes to write. */
typedef struct {
    Producer producers[MAX_BATCHES];
    int producer_count;
    int64_t now_ms, next, first_ts, write_bytes;
    int has_first_ts;
} Plan;

/* What reserve_room found room for: where the bytes go and the index entries they add. */
typedef struct {
    int64_t position, since, max_ts, max_ts_offset, end;
    int use_pwrite, offset_entry_count, time_entry_count;
    Entry offset_entries[MAX_BATCHES], time_entries[MAX_BATCHES];
} Room;

/* Check: every batch's header, CRC and records (validate_batch), before the lock or the
 * time, as the Python path checks. Large requests let the GIL go meanwhile (the CRC of
 * 1 MiB takes some 50 us). 1 when every batch passes. */
static int check_request(Appender *self, Batch *batches, Py_ssize_t n) {
    int64_t request_bytes = 0;
    int valid = 1;
    for (Py_ssize_t i = 0; i < n; i++) request_bytes += batches[i].size;
    if (request_bytes >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n && valid; i++) valid = check_batch(&batches[i], self->max_batch_bytes);
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t i = 0; i < n && valid; i++) valid = check_batch(&batches[i], self->max_batch_bytes);
    }
    return valid;
}

/* oncelog.clock.MonotonicWallClock.__call__: int(time.time() * 1000) with time.time()'s
 * own arithmetic (nanoseconds to a double of seconds), never below the high mark the
 * Python clock shares in `cell`. */
static int64_t wall_clock_ms(int64_t *cell) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return *cell;
    int64_t ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    double seconds = ns % 1000000000 == 0 ? (double)(ns / 1000000000) : (double)ns / 1e9;
    int64_t now = (int64_t)(seconds * 1000.0);
    if (now > *cell) *cell = now;
    return *cell;
}

/* The clock as the Python path reads it (a request always, a single batch with a
 * producer): 1 with `now_ms` set (0 when not read), 0 to fall back, -1 on an error. */
static int read_clock(Appender *self, Batch *batches, Py_ssize_t n, int single, int64_t *now_ms, int *any_pid) {
    *now_ms = 0;
    *any_pid = 0;
    for (Py_ssize_t i = 0; i < n; i++) *any_pid |= be64(batches[i].data + H_PRODUCER_ID) >= 0;
    if (!*any_pid && single) return 1;
    if (self->has_clock_cell) {
        *now_ms = wall_clock_ms(I64(self->clock_cell));
        return 1;
    }
    PyObject *now = PyObject_CallNoArgs(self->clock);
    if (now == NULL) return -1;
    int overflow = 0;
    *now_ms = PyLong_Check(now) ? PyLong_AsLongLongAndOverflow(now, &overflow) : 0;
    int usable = PyLong_Check(now) && !overflow && !(*now_ms == -1 && PyErr_Occurred());
    Py_DECREF(now);
    if (!usable) PyErr_Clear();
    return usable;
}

/* The request's working row for `pid`: found among those already read, else read from the
 * table (or marked new: "not in the table" is check_producer's mark). */
static Producer *working_producer(Appender *self, Plan *plan, int64_t pid) {
    for (int k = 0; k < plan->producer_count; k++)
        if (plan->producers[k].pid == pid) return &plan->producers[k];
    Producer *p = &plan->producers[plan->producer_count++];
    p->pid = pid;
    int64_t tombstone, bucket = probe(self, pid, &tombstone);
    if (I64(self->keys)[bucket] == MAP_EMPTY) {
        p->slot = -1;
        put_le64(p->row + R_PID, ~pid);
    } else {
        p->slot = ((int32_t *)self->values.buf)[bucket];
        memcpy(p->row, (uint8_t *)self->table.buf + p->slot * ROW_BYTES, ROW_BYTES);
    }
    return p;
}

/* Plan: offsets and producer rules, with no state changed (Log._plan). 1, or 0 to fall back. */
static int plan_request(Appender *self, Batch *batches, Py_ssize_t n, Plan *plan) {
    int64_t *seg = I64(self->seg), *ring = I64(self->ring), *map = I64(self->map_state);
    int64_t running_bytes = seg[SEG_SIZE];
    int new_count = 0;
    /* The map grows its range in Python (PidSlotMap._rebuild); one out of bounds is a bug there. */
    if (map[MAP_BUCKETS] <= 0 || map[MAP_BUCKETS] > self->max_buckets) return 0;
    plan->producer_count = 0;
    plan->next = seg[SEG_NEXT_OFFSET];
    plan->first_ts = seg[SEG_FIRST_BATCH_TS];
    plan->has_first_ts = seg[SEG_HAS_FIRST_TS] != 0;
    plan->write_bytes = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Batch *b = &batches[i];
        b->duplicate = 0;
        b->opens = 0;
        b->producer = -1;
        Producer *p = NULL;
        if (b->pid >= 0) {
            p = working_producer(self, plan, b->pid);
            b->producer = (int)(p - plan->producers);
            int64_t first_offset = 0, last_offset = 0;
            int verdict = check_producer(p, b, &first_offset, &last_offset);
            if (verdict == 0) return 0;
            if (verdict == 2) {
                b->duplicate = 1;
                b->base = first_offset;
                b->last = last_offset;
                continue;
            }
        }
        b->base = plan->next;
        if (__builtin_add_overflow(plan->next, (int64_t)b->last_delta, &b->last) || b->last > MAX_OFFSET) return 0;
        if (roll_needed(running_bytes, plan->has_first_ts, plan->first_ts, b->size, b->max_ts, b->last,
                        seg[SEG_LAST_OFFSET_LIMIT], self->segment_bytes, self->segment_ms))
            return 0;
        running_bytes += b->size;
        plan->write_bytes += b->size;
        if (!plan->has_first_ts) {
            plan->first_ts = b->max_ts;
            plan->has_first_ts = 1;
        }
        if (p != NULL) {
            int is_new = p->slot < 0 && le64(p->row + R_PID) != p->pid;
            if (is_new) {
                new_count++;
                if (map[MAP_COUNT] + new_count > self->capacity || ring[RING_USED] + new_count > self->capacity ||
                    (double)(map[MAP_COUNT] + map[MAP_TOMBSTONES] + new_count) >
                        (double)map[MAP_BUCKETS] * MAX_OCCUPIED_LOAD)
                    return 0; /* full, or the map would rebuild: the Python path's */
            }
            b->opens = b->transactional && (is_new || le64(p->row + R_TXN_FIRST) < 0);
            apply_producer(p, b, plan->now_ms);
            if (b->opens) put_le64(p->row + R_TXN_FIRST, b->base); /* (apply_batch: its first offset) */
        }
        plan->next = b->last + 1;
    }
    return 1;
}

/* Reserve: room for the bytes (the mapping, or a descriptor for pwrite) and the index
 * entries they add (LogSegment._index_batch), nothing written. 1, or 0 to fall back. */
static int reserve_room(Appender *self, const Batch *batches, Py_ssize_t n, const Plan *plan, Room *room) {
    int64_t *seg = I64(self->seg), *oidx = I64(self->offset_index), *tidx = I64(self->time_index);
    room->position = seg[SEG_SIZE];
    /* Large writes go to pwrite, as the Python path's do, small ones are copied into the
     * mapping; both land in the space reserved ahead (a pwrite there is cheaper than one
     * that extends the file). Past it, the Python path reserves more. */
    room->use_pwrite = plan->write_bytes >= WRITE_SYSCALL_MIN_BYTES;
    if (room->position + plan->write_bytes > seg[SEG_MAPPED_BYTES] || (room->use_pwrite && seg[SEG_WRITE_FD] < 0))
        return 0;
    room->offset_entry_count = room->time_entry_count = 0;
    int offset_known = 0, time_known = 0;
    room->since = seg[SEG_BYTES_SINCE_INDEX];
    room->max_ts = seg[SEG_MAX_TS];
    room->max_ts_offset = seg[SEG_OFFSET_OF_MAX_TS];
    int64_t o_entries = oidx[IDX_ENTRIES], t_entries = tidx[IDX_ENTRIES];
    Entry offset_last = {0, 0}, time_last = {0, 0};
    int64_t at = room->position, base_offset = seg[SEG_BASE_OFFSET];
    for (Py_ssize_t i = 0; i < n; i++) {
        const Batch *b = &batches[i];
        if (b->duplicate) continue;
        if (at > INT32_MAX) return 0; /* an index position is an i32 */
        if (b->max_ts > room->max_ts) {
            room->max_ts = b->max_ts;
            room->max_ts_offset = b->last;
        }
        int full = o_entries >= oidx[IDX_MAX_ENTRIES] - 1 || t_entries >= tidx[IDX_MAX_ENTRIES] - 1;
        if (room->since > seg[SEG_INDEX_INTERVAL] && !full) {
            /* Not mapped for writing, or no room reserved: the Python path reserves it. */
            if (oidx[IDX_ADDR] == 0 || tidx[IDX_ADDR] == 0 || o_entries >= oidx[IDX_CAPACITY]) return 0;
            Entry e = {b->last - base_offset, at};
            if (o_entries && !offset_known) offset_last = last_entry(oidx);
            /* OffsetIndex.append asserts this: the Python path fails it the same way */
            if (o_entries && !(e.first > offset_last.first && e.second > offset_last.second)) return 0;
            room->offset_entries[room->offset_entry_count++] = e;
            offset_last = e;
            offset_known = 1;
            o_entries++;
            if (t_entries && !time_known) time_last = last_entry(tidx);
            time_known = 1;
            if (!(t_entries && time_last.first >= room->max_ts)) { /* TimeIndex.maybe_append */
                Entry t = {room->max_ts, room->max_ts_offset - base_offset};
                if (t_entries >= tidx[IDX_CAPACITY] || t.second < 0) return 0;
                room->time_entries[room->time_entry_count++] = t;
                time_last = t;
                t_entries++;
            }
            room->since = 0;
        }
        room->since += b->size;
        at += b->size;
    }
    room->end = room->position + plan->write_bytes;
    return 1;
}

/* Write: the bytes, the body first and the 17-byte prefix last (a reader of the live file
 * never sees a header before the bytes it announces). 1, or 0 to fall back (nothing kept). */
static int write_request(Appender *self, const Batch *batches, Py_ssize_t n, const Room *room) {
    int64_t *seg = I64(self->seg);
    if (room->use_pwrite) return write_through_fd(batches, n, (int)seg[SEG_WRITE_FD], room->position, room->end - room->position);
    if (seg[SEG_WRITE_ADDR] == 0) return 0; /* unmapped: the Python path maps it */
    uint8_t *view = (uint8_t *)(intptr_t)seg[SEG_WRITE_ADDR];
    int64_t at = room->position;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Batch *b = &batches[i];
        if (b->duplicate) continue;
        memcpy(view + at + PREFIX_BYTES, b->data + PREFIX_BYTES, (size_t)(b->size - PREFIX_BYTES));
        put_be64(view + at + H_BASE_OFFSET, b->base);
        put_be32(view + at + H_LENGTH, (int32_t)(b->size - LOG_OVERHEAD));
        put_be32(view + at + H_LEADER_EPOCH, -1);
        view[at + H_MAGIC] = MAGIC_V2;
        at += b->size;
    }
    if (seg[SEG_WRITE_FD] >= 0) populate_ahead(seg, view, at); /* a real file (not the twin's memory) */
    return 1;
}

/* Take out of the open transactions the ones track_opened added, of the first `n` batches. */
static void untrack(Appender *self, const Batch *batches, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!batches[i].tracked) continue;
        PyObject *pid = PyLong_FromLongLong(batches[i].pid);
        if (pid == NULL || PyDict_DelItem(self->open_txns, pid) < 0) PyErr_Clear();
        Py_XDECREF(pid);
    }
}

/* Track: each transaction the request opens joins the log's open transactions (what the
 * last stable offset is read from) before the batches are published, so no reader sees
 * them as stable. 1, or 0 to fall back with the map as it was (a failed allocation). */
static int track_opened(Appender *self, Batch *batches, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Batch *b = &batches[i];
        b->tracked = 0;
        if (!b->opens) continue;
        PyObject *pid = PyLong_FromLongLong(b->pid), *first = PyLong_FromLongLong(b->base);
        int held = pid == NULL || first == NULL ? -1 : PyDict_Contains(self->open_txns, pid);
        if (held == 0) { /* (held: kept, as the Python path's setdefault keeps it) */
            held = PyDict_SetItem(self->open_txns, pid, first);
            b->tracked = held == 0;
        }
        Py_XDECREF(pid);
        Py_XDECREF(first);
        if (held < 0) {
            PyErr_Clear();
            untrack(self, batches, i);
            return 0;
        }
    }
    return 1;
}

/* Publish: the index entries, the segment's cursor, then the producer rows, only now
 * that their batches are written (ProducerStateManager.put). Cannot fail. */
static void publish_request(Appender *self, const Plan *plan, const Room *room) {
    int64_t *seg = I64(self->seg), *ring = I64(self->ring), *map = I64(self->map_state);
    int64_t *oidx = I64(self->offset_index), *tidx = I64(self->time_index);
    uint8_t *oview = (uint8_t *)(intptr_t)oidx[IDX_ADDR], *tview = (uint8_t *)(intptr_t)tidx[IDX_ADDR];
    for (int k = 0; k < room->offset_entry_count; k++) {
        int64_t e = oidx[IDX_ENTRIES] + k;
        put_be32(oview + 8 * e, (int32_t)room->offset_entries[k].first);
        put_be32(oview + 8 * e + 4, (int32_t)room->offset_entries[k].second);
    }
    for (int k = 0; k < room->time_entry_count; k++) {
        int64_t e = tidx[IDX_ENTRIES] + k;
        put_be64(tview + 12 * e, room->time_entries[k].first);
        put_be32(tview + 12 * e + 8, (int32_t)room->time_entries[k].second);
    }
    oidx[IDX_ENTRIES] += room->offset_entry_count;
    tidx[IDX_ENTRIES] += room->time_entry_count;
    if (room->offset_entry_count) {
        oidx[IDX_LAST_FIRST] = room->offset_entries[room->offset_entry_count - 1].first;
        oidx[IDX_LAST_SECOND] = room->offset_entries[room->offset_entry_count - 1].second;
    }
    if (room->time_entry_count) {
        tidx[IDX_LAST_FIRST] = room->time_entries[room->time_entry_count - 1].first;
        tidx[IDX_LAST_SECOND] = room->time_entries[room->time_entry_count - 1].second;
    }
    if (room->offset_entry_count) {
        int full = oidx[IDX_ENTRIES] >= oidx[IDX_MAX_ENTRIES] - 1 || tidx[IDX_ENTRIES] >= tidx[IDX_MAX_ENTRIES] - 1;
        int64_t limit = seg[SEG_BASE_OFFSET] + INT32_MAX_SEQ;
        seg[SEG_LAST_OFFSET_LIMIT] = full ? -1 : (limit < MAX_OFFSET ? limit : MAX_OFFSET);
    }
    if (plan->write_bytes) {
        seg[SEG_FIRST_BATCH_TS] = plan->first_ts;
        seg[SEG_HAS_FIRST_TS] = 1;
        seg[SEG_MAX_TS] = room->max_ts;
        seg[SEG_OFFSET_OF_MAX_TS] = room->max_ts_offset;
        seg[SEG_BYTES_SINCE_INDEX] = room->since;
        seg[SEG_NEXT_OFFSET] = plan->next;
        seg[SEG_SIZE] = room->end;
        seg[SEG_UNFLUSHED] = 1;
    }
    uint8_t *table = (uint8_t *)self->table.buf;
    for (int k = 0; k < plan->producer_count; k++) {
        const Producer *p = &plan->producers[k];
        if (le64(p->row + R_PID) != p->pid) continue; /* new, and only refused: nothing to store */
        int64_t slot = p->slot;
        if (slot < 0) {
            slot = (ring[RING_HEAD] + ring[RING_USED]) % self->capacity;
            __int128 due_ms = (__int128)plan->now_ms + ring[RING_EXPIRATION_MS];
            int64_t due_s = due_ms < 0 ? 0 : (due_ms / 1000 > MAX_DUE_S ? MAX_DUE_S : (int64_t)(due_ms / 1000));
            ring[RING_USED]++;
            int64_t tombstone, bucket = probe(self, p->pid, &tombstone);
            if (tombstone >= 0) {
                bucket = tombstone;
                map[MAP_TOMBSTONES]--;
            }
            I64(self->keys)[bucket] = ~p->pid;
            map[MAP_COUNT]++;
            ((int32_t *)self->values.buf)[bucket] = (int32_t)slot;
            ((int32_t *)self->bucket_of.buf)[slot] = (int32_t)bucket;
            ((uint32_t *)self->due.buf)[slot] = (uint32_t)due_s;
        }
        memcpy(table + slot * ROW_BYTES, p->row, ROW_BYTES);
    }
}

/* The results (AppendResult per batch, a list for a request), and the hot cache dropping
 * the producers changed here. NULL on an error. */
static PyObject *request_results(Appender *self, const Batch *batches, Py_ssize_t n, int single, const Plan *plan) {
    if (PyDict_GET_SIZE(self->hot)) {
        for (int k = 0; k < plan->producer_count; k++) {
            PyObject *key = PyLong_FromLongLong(plan->producers[k].pid);
            if (key == NULL) return NULL;
            if (PyDict_DelItem(self->hot, key) < 0) PyErr_Clear();
            Py_DECREF(key);
        }
    }
    PyObject *list = NULL;
    if (!single && (list = PyList_New(n)) == NULL) return NULL;
    PyTypeObject *type = (PyTypeObject *)self->result_type;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = type->tp_alloc(type, 4);
        if (item == NULL) {
            Py_XDECREF(list);
            return NULL;
        }
        PyObject *base = PyLong_FromLongLong(batches[i].base), *last = PyLong_FromLongLong(batches[i].last);
        PyObject *no_time = PyLong_FromLong(-1);
        if (base == NULL || last == NULL || no_time == NULL) {
            Py_XDECREF(base);
            Py_XDECREF(last);
            Py_XDECREF(no_time);
            Py_DECREF(item);
            Py_XDECREF(list);
            return NULL;
        }
        PyTuple_SET_ITEM(item, 0, base);
        PyTuple_SET_ITEM(item, 1, last);
        PyTuple_SET_ITEM(item, 2, no_time);
        PyTuple_SET_ITEM(item, 3, Py_NewRef(batches[i].duplicate ? Py_True : Py_False));
        if (single) return item;
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* One client request (`single`: one batch, answered with one result): check, plan,
 * reserve, write, publish, under the log's lock. None, with nothing changed, whenever the
 * Python path must take it. NULL on an error: from the lock or the clock before anything
 * changed; from building the results or releasing the lock after the append was committed
 * (the caller sees the error; the batches are in the log). */
static PyObject *append_request(Appender *self, Batch *batches, Py_ssize_t n, int single) {
    if (!check_request(self, batches, n)) Py_RETURN_NONE;
    PyObject *locked = PyObject_CallNoArgs(self->acquire);
    if (locked == NULL) return NULL;
    Py_DECREF(locked);
    PyObject *result = NULL;
    Plan plan;
    Room room;
    int any_pid;
    int clock = read_clock(self, batches, n, single, &plan.now_ms, &any_pid);
    if (clock < 0) goto unlock;
    if (clock == 0) goto fallback;
    /* Closed (rebound, failed, closed) while this waited for the lock or the clock: the
     * Python path decides. Below, no Python code runs until the request is written. */
    if (self->closed) goto fallback;
    const int64_t *ring = I64(self->ring);
    const uint32_t *due = (const uint32_t *)self->due.buf;
    if ((any_pid || !single) && ring[RING_USED] && (int64_t)due[ring[RING_HEAD]] * 1000 <= plan.now_ms)
        goto fallback; /* expiry is due: the Python path runs it */
    if (!plan_request(self, batches, n, &plan)) goto fallback;
    if (!reserve_room(self, batches, n, &plan, &room)) goto fallback;
    if (!write_request(self, batches, n, &room)) goto fallback;
    if (!track_opened(self, batches, n)) goto fallback;
    publish_request(self, &plan, &room); /* nothing below can fail the append */
    result = request_results(self, batches, n, single, &plan);
    goto unlock;

fallback:
    result = Py_NewRef(Py_None);
unlock:;
    /* The lock is released whatever happened, keeping an error raised above. */
    PyObject *type_, *value, *traceback;
    PyErr_Fetch(&type_, &value, &traceback);
    PyObject *released = PyObject_CallNoArgs(self->release);
    if (released == NULL) {
        Py_XDECREF(type_);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        Py_XDECREF(result);
        return NULL;
    }
    Py_DECREF(released);
    PyErr_Restore(type_, value, traceback);
    return result;
}

static PyObject *Appender_append(Appender *self, PyObject *batch) {
    Py_buffer view;
    if (PyObject_GetBuffer(batch, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Batch b = {.data = (const uint8_t *)view.buf, .size = view.len};
    PyObject *result = b.size >= HEADER_SIZE ? append_request(self, &b, 1, 1) : Py_NewRef(Py_None);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *Appender_append_batches(Appender *self, PyObject *sequence) {
    if (!PyList_CheckExact(sequence) && !PyTuple_CheckExact(sequence)) Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(sequence);
    if (n == 0 || n > MAX_BATCHES) Py_RETURN_NONE;
    Batch batches[MAX_BATCHES];
    PyObject **items = PySequence_Fast_ITEMS(sequence);
    for (Py_ssize_t i = 0; i < n; i++) {
        /* bytes only: anything else goes through the Python path's conversions */
        if (!PyBytes_CheckExact(items[i]) || PyBytes_GET_SIZE(items[i]) < HEADER_SIZE) Py_RETURN_NONE;
        batches[i].data = (const uint8_t *)PyBytes_AS_STRING(items[i]);
        batches[i].size = PyBytes_GET_SIZE(items[i]);
    }
    /* The list may not change under us: its items are referenced for the call. */
    PyObject *held = PySequence_Tuple(sequence);
    if (held == NULL) return NULL;
    PyObject *result = append_request(self, batches, n, 0);
    Py_DECREF(held);
    return result;
}

static int get_buffer(Appender *self, PyObject *source, Py_buffer *into, Py_ssize_t min_bytes, const char *name) {
    if (PyObject_GetBuffer(source, into, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    self->buffers_held++;
    if (into->len < min_bytes) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, fewer than %zd", name, into->len, min_bytes);
        return -1;
    }
    return 0;
}

static void release_buffers(Appender *self) {
    Py_buffer *all[] = {&self->table, &self->due, &self->ring, &self->keys, &self->values,
                        &self->bucket_of, &self->map_state, &self->seg, &self->offset_index, &self->time_index};
    for (int i = 0; i < self->buffers_held; i++) PyBuffer_Release(all[i]);
    self->buffers_held = 0;
    if (self->has_clock_cell) PyBuffer_Release(&self->clock_cell);
    self->has_clock_cell = 0;
}

static int Appender_init(Appender *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"lock", "clock", "hot", "result_type", "table", "due_s", "ring", "pid_keys",
                            "pid_values", "pid_bucket_of", "pid_map", "segment", "offset_index",
                            "time_index", "max_batch_bytes", "segment_bytes", "segment_ms", "open_transactions",
                            "clock_cell", NULL};
    PyObject *lock, *clock, *hot, *result_type, *table, *due, *ring, *keys, *values, *bucket_of, *map_state, *open_txns;
    PyObject *clock_cell = Py_None;
    PyObject *seg, *offset_index, *time_index;
    long long max_batch_bytes, segment_bytes, segment_ms;
    if (self->buffers_held || self->acquire != NULL) {
        PyErr_SetString(PyExc_TypeError, "an Appender is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O!" "OOOOOOOOOO" "LLLO!|O", names, &lock, &clock,
                                     &PyDict_Type, &hot, &PyType_Type, &result_type, &table, &due, &ring, &keys,
                                     &values, &bucket_of, &map_state, &seg, &offset_index, &time_index,
                                     &max_batch_bytes, &segment_bytes, &segment_ms, &PyDict_Type, &open_txns,
                                     &clock_cell))
        return -1;
    if (!PyType_IsSubtype((PyTypeObject *)result_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "result_type must be a tuple type");
        return -1;
    }
    self->acquire = PyObject_GetAttrString(lock, "acquire");
    self->release = PyObject_GetAttrString(lock, "release");
    if (self->acquire == NULL || self->release == NULL) return -1;
    self->clock = Py_NewRef(clock);
    self->hot = Py_NewRef(hot);
    self->open_txns = Py_NewRef(open_txns);
    self->result_type = Py_NewRef(result_type);
    if (get_buffer(self, table, &self->table, ROW_BYTES, "table") < 0 ||
        get_buffer(self, due, &self->due, 4, "due_s") < 0 ||
        get_buffer(self, ring, &self->ring, RING_FIELDS * 8, "ring") < 0 ||
        get_buffer(self, keys, &self->keys, 8, "pid_keys") < 0 ||
        get_buffer(self, values, &self->values, 4, "pid_values") < 0 ||
        get_buffer(self, bucket_of, &self->bucket_of, 4, "pid_bucket_of") < 0 ||
        get_buffer(self, map_state, &self->map_state, MAP_FIELDS * 8, "pid_map") < 0 ||
        get_buffer(self, seg, &self->seg, SEG_FIELDS * 8, "segment") < 0 ||
        get_buffer(self, offset_index, &self->offset_index, IDX_FIELDS * 8, "offset_index") < 0 ||
        get_buffer(self, time_index, &self->time_index, IDX_FIELDS * 8, "time_index") < 0)
        return -1;
    if (clock_cell != Py_None) {
        if (PyObject_GetBuffer(clock_cell, &self->clock_cell, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
        self->has_clock_cell = 1;
        if (self->clock_cell.len != 8) {
            PyErr_Format(PyExc_ValueError, "clock_cell holds %zd bytes, not 8", self->clock_cell.len);
            return -1;
        }
    }
    self->capacity = self->table.len / ROW_BYTES;
    self->max_buckets = self->keys.len / 8;
    if (self->due.len / 4 < self->capacity || self->bucket_of.len / 4 < self->capacity ||
        self->values.len / 4 < self->max_buckets) {
        PyErr_SetString(PyExc_ValueError, "the producer arrays disagree on the table's capacity");
        return -1;
    }
    self->max_batch_bytes = max_batch_bytes;
    self->segment_bytes = segment_bytes;
    self->segment_ms = segment_ms;
    return 0;
}

static void Appender_dealloc(Appender *self) {
    release_buffers(self);
    Py_XDECREF(self->acquire);
    Py_XDECREF(self->release);
    Py_XDECREF(self->clock);
    Py_XDECREF(self->hot);
    Py_XDECREF(self->open_txns);
    Py_XDECREF(self->result_type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Appender_close(Appender *self, PyObject *unused) {
    (void)unused;
    /* Only a flag: a call waiting for the lock still holds this object, and finds it
     * closed once it has the lock. The arrays are let go of when the object is freed. */
    self->closed = 1;
    Py_RETURN_NONE;
}

static PyObject *Appender_append_checked(Appender *self, PyObject *batch) {
    if (self->closed) Py_RETURN_NONE;
    return Appender_append(self, batch);
}

static PyObject *Appender_append_batches_checked(Appender *self, PyObject *batches) {
    if (self->closed) Py_RETURN_NONE;
    return Appender_append_batches(self, batches);
}

static PyMethodDef Appender_methods[] = {
    {"append", (PyCFunction)Appender_append_checked, METH_O,
     "append(batch) -> AppendResult, or None: the Python path must take this batch (nothing changed)."},
    {"append_batches", (PyCFunction)Appender_append_batches_checked, METH_O,
     "append_batches(list of bytes) -> list of AppendResult, or None (nothing changed)."},
    {"close", (PyCFunction)Appender_close, METH_NOARGS, "Later calls (and any waiting) return None."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "oncelog._append.Appender",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One log's compiled client append over its shared state arrays.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Appender_init,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_methods = Appender_methods,
};

/* ---- the Log's append method ----------------------------------------------------------
 * Log.append as a method descriptor (as functions are): a call with one bytes batch and
 * no keywords goes straight to the Appender the log keeps in `attribute` (None when the
 * compiled path is off, unbound, or the log must count appends for its flush policy);
 * every other call, and every batch the Appender leaves to Python, goes to the Python
 * method, which tries the Appender itself where it applies. No Python frame runs on the
 * common path: that frame cost more than the append (measured: 0.20 us of 0.33 us). */
typedef struct {
    PyObject_HEAD
    PyObject *python;    /* the Python method, which takes every call this one does not finish */
    PyObject *attribute; /* interned name of the log's attribute holding its Appender or None */
    vectorcallfunc vectorcall;
} AppendMethod;

static PyObject *AppendMethod_vectorcall(AppendMethod *self, PyObject *const *args, size_t nargsf,
                                         PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 2 && kwnames == NULL && PyBytes_CheckExact(args[1]) && PyBytes_GET_SIZE(args[1]) >= HEADER_SIZE) {
        PyObject *appender = PyObject_GetAttr(args[0], self->attribute);
        if (appender == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
            PyErr_Clear(); /* not a log: the Python method says what is wrong */
        } else if (Py_IS_TYPE(appender, &AppenderType) && !((Appender *)appender)->closed) {
            Batch b = {.data = (const uint8_t *)PyBytes_AS_STRING(args[1]), .size = PyBytes_GET_SIZE(args[1])};
            PyObject *result = append_request((Appender *)appender, &b, 1, 1);
            Py_DECREF(appender);
            if (result != Py_None) return result; /* the result, or NULL with the error */
            Py_DECREF(result);
        } else {
            Py_DECREF(appender);
        }
    }
    return PyObject_Vectorcall(self->python, args, nargsf, kwnames);
}

static PyObject *AppendMethod_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *python, *attribute;
    static char *names[] = {"python", "attribute", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OU", names, &python, &attribute)) return NULL;
    if (!PyCallable_Check(python)) {
        PyErr_SetString(PyExc_TypeError, "python must be callable");
        return NULL;
    }
    AppendMethod *self = (AppendMethod *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->python = Py_NewRef(python);
    Py_INCREF(attribute);
    PyUnicode_InternInPlace(&attribute);
    self->attribute = attribute;
    self->vectorcall = (vectorcallfunc)AppendMethod_vectorcall;
    return (PyObject *)self;
}

static void AppendMethod_dealloc(AppendMethod *self) {
    Py_XDECREF(self->python);
    Py_XDECREF(self->attribute);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *AppendMethod_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* __doc__, __name__, __qualname__, __module__: the Python method's, so help() and
 * inspect read it (inspect.signature follows __wrapped__). */
static PyObject *AppendMethod_forward(AppendMethod *self, void *name) {
    return PyObject_GetAttrString(self->python, (const char *)name);
}

static PyObject *AppendMethod_wrapped(AppendMethod *self, void *unused) {
    (void)unused;
    return Py_NewRef(self->python);
}

static PyGetSetDef AppendMethod_getset[] = {
    {"__doc__", (getter)AppendMethod_forward, NULL, NULL, "__doc__"},
    {"__name__", (getter)AppendMethod_forward, NULL, NULL, "__name__"},
    {"__qualname__", (getter)AppendMethod_forward, NULL, NULL, "__qualname__"},
    {"__module__", (getter)AppendMethod_forward, NULL, NULL, "__module__"},
    {"__wrapped__", (getter)AppendMethod_wrapped, NULL, "the Python method", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AppendMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "oncelog._append.AppendMethod",
    .tp_basicsize = sizeof(AppendMethod),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(AppendMethod, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = AppendMethod_new,
    .tp_dealloc = (destructor)AppendMethod_dealloc,
    .tp_descr_get = AppendMethod_get,
    .tp_getset = AppendMethod_getset,
};

/* ---- recovery's tail scan ---------------------------------------------------------------
 * LogSegment.rebuild's loop for the common batch, in C: the header checks and CRC of
 * RecordBatch.validate (batch_size_at's impossible lengths included), offsets that
 * increase, a client-only log's stamps, the segment's first offset, then _index_batch:
 * the cursor's times, offsets and size, and an index entry (offset, and time when it
 * grew) wherever more than the interval was written since the last. The index entries
 * go straight into the mapped indexes through their cursors, as the append's do.
 *
 * It stops, with nothing of that batch applied, at anything it leaves to Python: a
 * control or transactional batch (replayed one at a time), any check that fails (Python
 * raises it with its message), zeros, an index with no room reserved. Python then takes
 * that one batch through the reference loop and calls this again after it. Each batch
 * it takes adds a row for the replay (TAIL_ROW_* below), whether or not it has a
 * producer. The GIL is let go for the walk: nothing here touches a Python object. */
enum { TAIL_PID, TAIL_EPOCH, TAIL_FIRST_SEQ, TAIL_LAST_SEQ, TAIL_FIRST_OFFSET, TAIL_LAST_OFFSET,
       TAIL_MAX_TS, TAIL_END_POSITION, TAIL_ROW_COLUMNS };
enum { SCAN_END, SCAN_PYTHON, SCAN_ROWS_FULL };
#define CONTROL_MASK 0x20
#define COMPRESSION_MASK 0x07
#define MAX_COMPRESSION 4
#define SIZE_AND_MAGIC_BYTES 17

typedef struct {
    const uint8_t *data;
    int64_t length, file_position, first_base_offset, max_rows;
    int client_only;
    int64_t *seg, *oidx, *tidx, *rows;
} TailScan;

/* 1 when the index entry went in (or none was due); 0 to leave the batch to Python. */
static int scan_index_entry(TailScan *t, int64_t last, int64_t position) {
    int64_t *seg = t->seg, *oidx = t->oidx, *tidx = t->tidx;
    int full = oidx[IDX_ENTRIES] >= oidx[IDX_MAX_ENTRIES] - 1 || tidx[IDX_ENTRIES] >= tidx[IDX_MAX_ENTRIES] - 1;
    if (!(seg[SEG_BYTES_SINCE_INDEX] > seg[SEG_INDEX_INTERVAL]) || full) return 1;
    int64_t base = seg[SEG_BASE_OFFSET], rel = last - base;
    int time_due = !(tidx[IDX_ENTRIES] && tidx[IDX_LAST_FIRST] >= seg[SEG_MAX_TS]);
    if (oidx[IDX_ADDR] == 0 || oidx[IDX_ENTRIES] >= oidx[IDX_CAPACITY]) return 0;
    if (time_due && (tidx[IDX_ADDR] == 0 || tidx[IDX_ENTRIES] >= tidx[IDX_CAPACITY])) return 0;
    if (rel > INT32_MAX || position > INT32_MAX) return 0;
    if (oidx[IDX_ENTRIES] && !(rel > oidx[IDX_LAST_FIRST] && position > oidx[IDX_LAST_SECOND])) return 0;
    uint8_t *oview = (uint8_t *)(intptr_t)oidx[IDX_ADDR];
    put_be32(oview + 8 * oidx[IDX_ENTRIES], (int32_t)rel);
    put_be32(oview + 8 * oidx[IDX_ENTRIES] + 4, (int32_t)position);
    oidx[IDX_ENTRIES] += 1;
    oidx[IDX_LAST_FIRST] = rel;
    oidx[IDX_LAST_SECOND] = position;
    if (time_due) {
        int64_t time_rel = seg[SEG_OFFSET_OF_MAX_TS] - base;
        uint8_t *tview = (uint8_t *)(intptr_t)tidx[IDX_ADDR];
        put_be64(tview + 12 * tidx[IDX_ENTRIES], seg[SEG_MAX_TS]);
        put_be32(tview + 12 * tidx[IDX_ENTRIES] + 8, (int32_t)time_rel);
        tidx[IDX_ENTRIES] += 1;
        tidx[IDX_LAST_FIRST] = seg[SEG_MAX_TS];
        tidx[IDX_LAST_SECOND] = time_rel;
    }
    seg[SEG_BYTES_SINCE_INDEX] = 0;
    return 1;
}

/* One batch at `at` of the buffer: SCAN_END (it does not fit), SCAN_PYTHON, or -1 when
 * taken (its size in *size). */
static int scan_one(TailScan *t, int64_t at, int64_t *size, int64_t row) {
    const uint8_t *d = t->data + at;
    int64_t left = t->length - at, *seg = t->seg;
    if (left < SIZE_AND_MAGIC_BYTES) return SCAN_END;
    int64_t length = be32(d + H_LENGTH);
    if (d[H_MAGIC] != MAGIC_V2 || length < HEADER_SIZE - LOG_OVERHEAD) return SCAN_PYTHON; /* zeros too */
    *size = length + LOG_OVERHEAD;
    if (*size > left) return SCAN_END;
    int16_t attributes = be16(d + H_ATTRIBUTES);
    int32_t delta = be32(d + H_LAST_OFFSET_DELTA), count = be32(d + H_RECORDS_COUNT);
    int64_t base = be64(d + H_BASE_OFFSET), last, position = t->file_position + at;
    if (crc32c_of(d + CRC_START, (size_t)(*size - CRC_START)) != (uint32_t)be32(d + H_CRC)) return SCAN_PYTHON;
    if (delta < 0 || count < 0 || count > (int64_t)delta + 1) return SCAN_PYTHON;
    if ((attributes & COMPRESSION_MASK) > MAX_COMPRESSION) return SCAN_PYTHON;
    if (attributes & (CONTROL_MASK | TRANSACTIONAL_MASK)) return SCAN_PYTHON; /* replayed one by one */
    int64_t previous_last = seg[SEG_NEXT_OFFSET] - 1;
    if (__builtin_add_overflow(base, (int64_t)delta, &last) || base <= previous_last) return SCAN_PYTHON;
    if (last - seg[SEG_BASE_OFFSET] > INT32_MAX) return SCAN_PYTHON; /* past the index's i32: corrupt */
    if (t->client_only && (be32(d + H_LEADER_EPOCH) != -1 || (position > 0 && base != previous_last + 1)))
        return SCAN_PYTHON;
    if (position == 0 && t->first_base_offset >= 0 && base != t->first_base_offset) return SCAN_PYTHON;
    /* Checked: now _index_batch, in its order. The entry first, as it may leave the batch to
     * Python, before anything of it is applied. */
    int64_t max_ts = be64(d + H_MAX_TIMESTAMP);
    int64_t saved_max_ts = seg[SEG_MAX_TS], saved_max_ts_offset = seg[SEG_OFFSET_OF_MAX_TS];
    if (max_ts > seg[SEG_MAX_TS]) {
        seg[SEG_MAX_TS] = max_ts;
        seg[SEG_OFFSET_OF_MAX_TS] = last;
    }
    if (!scan_index_entry(t, last, position)) {
        seg[SEG_MAX_TS] = saved_max_ts;
        seg[SEG_OFFSET_OF_MAX_TS] = saved_max_ts_offset;
        return SCAN_PYTHON;
    }
    if (!seg[SEG_HAS_FIRST_TS]) {
        seg[SEG_FIRST_BATCH_TS] = max_ts;
        seg[SEG_HAS_FIRST_TS] = 1;
    }
    seg[SEG_BYTES_SINCE_INDEX] += *size;
    seg[SEG_NEXT_OFFSET] = last + 1;
    seg[SEG_SIZE] = position + *size;
    int64_t *r = t->rows + row * TAIL_ROW_COLUMNS;
    int32_t base_seq = be32(d + H_BASE_SEQUENCE);
    r[TAIL_PID] = be64(d + H_PRODUCER_ID);
    r[TAIL_EPOCH] = be16(d + H_PRODUCER_EPOCH);
    r[TAIL_FIRST_SEQ] = base_seq;
    /* RecordBatch.last_sequence: none (-1) stays none; anything else (a leader's negative
     * sequence included) wraps past Int.MAX as Python's modulo does, never negative */
    int64_t wrapped = ((int64_t)base_seq + delta) % (INT32_MAX_SEQ + 1);
    r[TAIL_LAST_SEQ] = base_seq == -1 ? -1 : (wrapped < 0 ? wrapped + INT32_MAX_SEQ + 1 : wrapped);
    r[TAIL_FIRST_OFFSET] = base;
    r[TAIL_LAST_OFFSET] = last;
    r[TAIL_MAX_TS] = max_ts;
    r[TAIL_END_POSITION] = position + *size;
    return -1;
}

static PyObject *py_scan_tail(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *names[] = {"data", "file_position", "segment", "offset_index", "time_index", "rows",
                            "client_only", "first_base_offset", NULL};
    Py_buffer data, seg, oidx, tidx, rows;
    long long file_position, first_base_offset;
    int client_only;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*Lw*w*w*w*pL", names, &data, &file_position, &seg, &oidx,
                                     &tidx, &rows, &client_only, &first_base_offset))
        return NULL;
    PyObject *result = NULL;
    if (seg.len < SEG_FIELDS * 8 || oidx.len < IDX_FIELDS * 8 || tidx.len < IDX_FIELDS * 8) {
        PyErr_SetString(PyExc_ValueError, "a cursor is shorter than its layout");
        goto done;
    }
    TailScan t = {.data = (const uint8_t *)data.buf, .length = data.len, .file_position = file_position,
                  .first_base_offset = first_base_offset, .max_rows = rows.len / (8 * TAIL_ROW_COLUMNS),
                  .client_only = client_only, .seg = I64(seg), .oidx = I64(oidx), .tidx = I64(tidx),
                  .rows = I64(rows)};
    int64_t at = 0, taken = 0;
    int stop = SCAN_END;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        if (taken >= t.max_rows) {
            stop = SCAN_ROWS_FULL;
            break;
        }
        int64_t size = 0;
        int outcome = scan_one(&t, at, &size, taken);
        if (outcome >= 0) {
            stop = outcome;
            break;
        }
        at += size;
        taken++;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(LLi)", (long long)taken, (long long)at, stop);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&seg);
    PyBuffer_Release(&oidx);
    PyBuffer_Release(&tidx);
    PyBuffer_Release(&rows);
    return result;
}

/* ---- module functions ---------------------------------------------------------------- */
static PyObject *py_crc32c(PyObject *module, PyObject *data) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t crc = crc32c_of((const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* The raw CRC-32C by every path this CPU can take (None for one it cannot): the tests
 * hold each one to the crc32c package, whichever crc32c() picks here. */
static PyObject *py_crc32c_by_each_path(PyObject *module, PyObject *data) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = (const uint8_t *)view.buf;
    size_t n = (size_t)view.len;
    uint32_t software = ~crc_software(0xFFFFFFFFu, p, n);
    long long three_streams = -1, folded = -1, folded256 = -1;
#if defined(__x86_64__)
    if (have_sse42) three_streams = ~crc_three_streams(0xFFFFFFFFu, p, n, SHORT_BLOCK, shift_short) & 0xFFFFFFFFu;
    if (have_vpclmul && n >= FOLD_MIN_BYTES) folded = ~crc_folded(0xFFFFFFFFu, p, n) & 0xFFFFFFFFu;
    if (have_vpclmul256 && n >= FOLD_MIN_BYTES) folded256 = ~crc_folded256(0xFFFFFFFFu, p, n) & 0xFFFFFFFFu;
#endif
    PyBuffer_Release(&view);
    PyObject *paths = PyDict_New();
    if (paths == NULL) return NULL;
    const char *names[4] = {"software", "three_streams", "folded", "folded256"};
    long long values[4] = {software, three_streams, folded, folded256};
    for (int i = 0; i < 4; i++) {
        PyObject *value = values[i] < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(values[i]);
        if (value == NULL || PyDict_SetItemString(paths, names[i], value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(paths);
            return NULL;
        }
        Py_DECREF(value);
    }
    return paths;
}

/* check_batch for one buffer: what the Python path's validate_batch checks of a client
 * batch, stricter never looser (a compressed batch, or one with record headers, is 0:
 * the Python path decides). */
/* oncelog.pid_map.PidSlotMap.load's placing of keys, one at a time: into an empty range of
 * `buckets`, each id at the first empty bucket from its home (the probe the append makes).
 * The homes of the keys a few places ahead are prefetched: the keys land at random in a
 * range of megabytes, and a miss each would cost more than the rest of the work. */
enum { MAP_PREFETCH_AHEAD = 16 };

static int64_t load_pid_map(int64_t *keys, int32_t *values, int32_t *bucket_of, int64_t max_slot,
                            const char *ids, Py_ssize_t id_stride, const int32_t *slots, int64_t count,
                            int64_t buckets) {
    for (int64_t n = 0; n < count; n++) {
        if (n + MAP_PREFETCH_AHEAD < count) {
            int64_t ahead;
            memcpy(&ahead, ids + (n + MAP_PREFETCH_AHEAD) * id_stride, 8);
            int64_t h = home_bucket(ahead, buckets);
            __builtin_prefetch(keys + h, 1);
            __builtin_prefetch(values + h, 1);
        }
        int64_t pid, slot = slots[n];
        memcpy(&pid, ids + n * id_stride, 8);
        if (pid < 0 || slot < 0 || slot > max_slot) return -2 - n;
        int64_t i = home_bucket(pid, buckets), stored = ~pid;
        while (keys[i] != MAP_EMPTY) {
            if (keys[i] == stored) return n; /* the same id twice */
            if (++i == buckets) i = 0;
        }
        keys[i] = stored;
        values[i] = (int32_t)slot;
        bucket_of[slot] = (int32_t)i;
    }
    return -1;
}

/* Whether a buffer holds native-order signed 64-bit integers (ids of another type or byte
 * order would be read as other ids). */
static int native_int64(const Py_buffer *view) {
    const char *format = view->format == NULL ? "B" : view->format;
    if (*format == '@' || *format == '=' || (*format == '<' && PY_LITTLE_ENDIAN)) format++;
    return view->itemsize == 8 && (strcmp(format, "q") == 0 || (strcmp(format, "l") == 0 && sizeof(long) == 8));
}

/* oncelog.pid_map.PidSlotMap.delete_slots: the keys of the producers in `slots` become
 * tombstones, in one pass over a map of megabytes (each key found through bucket_of,
 * prefetched ahead, checked to be live keys before any store).
 * Returns -1, or the index of the first slot that holds no producer (nothing changed). */
static int64_t delete_pid_slots(int64_t *keys, const int32_t *bucket_of, int64_t max_bucket, int64_t max_slot,
                                const int64_t *slots, int64_t count) {
    for (int64_t n = 0; n < count; n++) {
        if (n + MAP_PREFETCH_AHEAD < count) {
            int64_t ahead = slots[n + MAP_PREFETCH_AHEAD];
            if (ahead >= 0 && ahead <= max_slot && bucket_of[ahead] >= 0 && bucket_of[ahead] <= max_bucket)
                __builtin_prefetch(keys + bucket_of[ahead], 1);
        }
        int64_t slot = slots[n];
        if (slot < 0 || slot > max_slot || bucket_of[slot] < 0 || bucket_of[slot] > max_bucket ||
            keys[bucket_of[slot]] >= 0)
            return n;
    }
    /* Each store checked again: the arrays may alias or change once the GIL is let go, and no
     * store may land outside the range in use. (The keys are in cache from the pass above.) */
    for (int64_t n = 0; n < count; n++) {
        int64_t slot = slots[n];
        if (slot < 0 || slot > max_slot) continue;
        int64_t bucket = bucket_of[slot];
        if (bucket >= 0 && bucket <= max_bucket) keys[bucket] = MAP_TOMBSTONE;
    }
    return -1;
}

static PyObject *py_delete_pid_slots(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer keys, bucket_of, slots = {0};
    PyObject *slot_source;
    long long buckets;
    if (!PyArg_ParseTuple(args, "w*y*OL", &keys, &bucket_of, &slot_source, &buckets)) return NULL;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(slot_source, &slots, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    if (!native_int64(&slots) || bucket_of.len % 4 != 0 || buckets < 1 || buckets > keys.len / 8) {
        PyErr_SetString(PyExc_ValueError, "delete_pid_slots: arrays that do not fit the map's layout");
        goto done;
    }
    int64_t failed;
    Py_BEGIN_ALLOW_THREADS
    failed = delete_pid_slots(I64(keys), (const int32_t *)bucket_of.buf, buckets - 1, bucket_of.len / 4 - 1,
                              (const int64_t *)slots.buf, slots.len / 8);
    Py_END_ALLOW_THREADS
    result = PyLong_FromLongLong(failed);
done:
    PyBuffer_Release(&keys);
    PyBuffer_Release(&bucket_of);
    if (slots.obj != NULL) PyBuffer_Release(&slots);
    return result;
}

static PyObject *py_load_pid_map(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer keys, values, bucket_of, ids = {0}, slots;
    PyObject *id_source;
    long long buckets;
    if (!PyArg_ParseTuple(args, "w*w*w*Oy*L", &keys, &values, &bucket_of, &id_source, &slots, &buckets))
        return NULL;
    PyObject *result = NULL;
    /* The ids may be a column of the producer table: a strided view, read in place. */
    if (PyObject_GetBuffer(id_source, &ids, PyBUF_STRIDED_RO | PyBUF_FORMAT) < 0) goto done;
    int64_t count = ids.ndim == 1 ? ids.shape[0] : -1;
    /* Compared by division: a huge `buckets` must not overflow past the check. */
    if (!native_int64(&ids) || count < 0 || slots.len / 4 != count || slots.len % 4 != 0 || buckets < 1 ||
        buckets > keys.len / 8 || buckets > values.len / 4 ||
        (double)count > (double)buckets * MAX_OCCUPIED_LOAD) {
        PyErr_SetString(PyExc_ValueError, "load_pid_map: arrays that do not fit the map's layout");
        goto done;
    }
    for (int64_t i = 0; i < buckets; i++) {
        if (I64(keys)[i] != MAP_EMPTY) {
            PyErr_SetString(PyExc_ValueError, "load_pid_map: the range in use is not empty");
            goto done;
        }
    }
    int64_t placed;
    Py_BEGIN_ALLOW_THREADS
    placed = load_pid_map(I64(keys), (int32_t *)values.buf, (int32_t *)bucket_of.buf, bucket_of.len / 4 - 1,
                          (const char *)ids.buf, ids.strides[0], (const int32_t *)slots.buf, count, buckets);
    Py_END_ALLOW_THREADS
    if (placed <= -2) {
        PyErr_Format(PyExc_ValueError, "load_pid_map: entry %lld has a negative id or a slot out of range",
                     (long long)(-2 - placed));
        goto done;
    }
    result = PyLong_FromLongLong(placed);
done:
    PyBuffer_Release(&keys);
    PyBuffer_Release(&values);
    PyBuffer_Release(&bucket_of);
    if (ids.obj != NULL) PyBuffer_Release(&ids);
    PyBuffer_Release(&slots);
    return result;
}

static PyObject *py_check_client_batch(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    long long max_batch_bytes;
    if (!PyArg_ParseTuple(args, "y*L", &view, &max_batch_bytes)) return NULL;
    Batch b = {.data = (const uint8_t *)view.buf, .size = view.len};
    int ok = check_batch(&b, (int64_t)max_batch_bytes);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyMethodDef module_methods[] = {
    {"crc32c", py_crc32c, METH_O, "crc32c(data) -> the CRC-32C of the bytes (what batches carry)."},
    {"crc32c_by_each_path", py_crc32c_by_each_path, METH_O,
     "crc32c_by_each_path(data) -> {path: CRC-32C or None}: slice-by-8 tables, SSE4.2's crc32 in "
     "three streams, AVX-512 carry-less folding (None where this CPU or length does not take it)."},
    {"check_client_batch", py_check_client_batch, METH_VARARGS,
     "check_client_batch(batch, max_batch_bytes) -> True when the client batch passes every check "
     "of oncelog.validation.validate_batch (False: the Python checks decide, and say why)."},
    {"delete_pid_slots", py_delete_pid_slots, METH_VARARGS,
     "delete_pid_slots(keys, bucket_of, slots, buckets) -> -1, or the index of the first slot holding no "
     "producer (then nothing is deleted): each slot's key becomes a tombstone "
     "(oncelog.pid_map.PidSlotMap.delete_slots)."},
    {"load_pid_map", py_load_pid_map, METH_VARARGS,
     "load_pid_map(keys, values, bucket_of, producer_ids, slots, buckets) -> -1, or the index of the "
     "first id met twice: each id placed into the empty range at the first empty bucket from its home "
     "(oncelog.pid_map.PidSlotMap.load)."},
    {"scan_tail", (PyCFunction)(void (*)(void))py_scan_tail, METH_VARARGS | METH_KEYWORDS,
     "scan_tail(data, file_position, segment, offset_index, time_index, rows, client_only, "
     "first_base_offset) -> (batches, bytes, stop): recovery's loop over the common batch "
     "(see oncelog.segments.segment.LogSegment.rebuild)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "oncelog._append",
                                        "The compiled client append (see oncelog.compiled_append).", -1,
                                        module_methods, NULL, NULL, NULL, NULL};

static int add_layout(PyObject *layout, const char *name, long value) {
    PyObject *v = PyLong_FromLong(value);
    if (v == NULL) return -1;
    int rc = PyDict_SetItemString(layout, name, v);
    Py_DECREF(v);
    return rc;
}

PyMODINIT_FUNC PyInit__append(void) {
    init_crc();
    if (PyType_Ready(&AppenderType) < 0 || PyType_Ready(&AppendMethodType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    PyObject *layout = PyDict_New();
    if (layout == NULL) goto error;
    struct { const char *name; long value; } fields[] = {
        {"SEG_WRITE_ADDR", SEG_WRITE_ADDR}, {"SEG_MAPPED_BYTES", SEG_MAPPED_BYTES}, {"SEG_SIZE", SEG_SIZE},
        {"SEG_NEXT_OFFSET", SEG_NEXT_OFFSET}, {"SEG_FIRST_BATCH_TS", SEG_FIRST_BATCH_TS},
        {"SEG_MAX_TS", SEG_MAX_TS}, {"SEG_OFFSET_OF_MAX_TS", SEG_OFFSET_OF_MAX_TS},
        {"SEG_BYTES_SINCE_INDEX", SEG_BYTES_SINCE_INDEX}, {"SEG_INDEX_INTERVAL", SEG_INDEX_INTERVAL},
        {"SEG_LAST_OFFSET_LIMIT", SEG_LAST_OFFSET_LIMIT}, {"SEG_UNFLUSHED", SEG_UNFLUSHED},
        {"SEG_BASE_OFFSET", SEG_BASE_OFFSET}, {"SEG_HAS_FIRST_TS", SEG_HAS_FIRST_TS},
        {"SEG_WRITE_FD", SEG_WRITE_FD}, {"SEG_POPULATED", SEG_POPULATED}, {"SEG_FIELDS", SEG_FIELDS},
        {"IDX_ADDR", IDX_ADDR}, {"IDX_ENTRIES", IDX_ENTRIES}, {"IDX_CAPACITY", IDX_CAPACITY},
        {"IDX_MAX_ENTRIES", IDX_MAX_ENTRIES}, {"IDX_LAST_FIRST", IDX_LAST_FIRST},
        {"IDX_LAST_SECOND", IDX_LAST_SECOND}, {"IDX_FIELDS", IDX_FIELDS},
        {"RING_HEAD", RING_HEAD}, {"RING_USED", RING_USED}, {"RING_HOLES", RING_HOLES},
        {"RING_EXPIRATION_MS", RING_EXPIRATION_MS}, {"RING_FIELDS", RING_FIELDS},
        {"MAP_COUNT", MAP_COUNT}, {"MAP_TOMBSTONES", MAP_TOMBSTONES}, {"MAP_BUCKETS", MAP_BUCKETS},
        {"MAP_FIELDS", MAP_FIELDS},
        {"ROW_BYTES", ROW_BYTES}, {"R_PID", R_PID}, {"R_APPEND_MS", R_APPEND_MS},
        {"R_TIMESTAMP_MS", R_TIMESTAMP_MS}, {"R_TXN_FIRST", R_TXN_FIRST},
        {"R_COORDINATOR_EPOCH", R_COORDINATOR_EPOCH}, {"R_EPOCH", R_EPOCH}, {"R_COUNT", R_COUNT},
        {"R_LIVE", R_LIVE}, {"R_LAST_SEQ", R_LAST_SEQ}, {"R_LAST_OFFSET", R_LAST_OFFSET}, {"R_DELTA", R_DELTA},
        {"R_MAX_TS", R_MAX_TS}, {"WINDOW", WINDOW}, {"MAX_BATCHES", MAX_BATCHES},
        {"H_BASE_OFFSET", H_BASE_OFFSET}, {"H_LENGTH", H_LENGTH}, {"H_LEADER_EPOCH", H_LEADER_EPOCH},
        {"H_MAGIC", H_MAGIC}, {"H_CRC", H_CRC}, {"H_ATTRIBUTES", H_ATTRIBUTES},
        {"H_LAST_OFFSET_DELTA", H_LAST_OFFSET_DELTA}, {"H_BASE_TIMESTAMP", H_BASE_TIMESTAMP},
        {"H_MAX_TIMESTAMP", H_MAX_TIMESTAMP}, {"H_PRODUCER_ID", H_PRODUCER_ID},
        {"H_PRODUCER_EPOCH", H_PRODUCER_EPOCH}, {"H_BASE_SEQUENCE", H_BASE_SEQUENCE},
        {"H_RECORDS_COUNT", H_RECORDS_COUNT}, {"HEADER_SIZE", HEADER_SIZE}, {"LOG_OVERHEAD", LOG_OVERHEAD},
        {"PREFIX_BYTES", PREFIX_BYTES}, {"CRC_START", CRC_START}, {"MAGIC_V2", MAGIC_V2},
        {"COMPRESSION_AND_CONTROL", COMPRESSION_AND_CONTROL}, {"TIMESTAMP_TYPE_MASK", TIMESTAMP_TYPE_MASK},
        {"TRANSACTIONAL_MASK", TRANSACTIONAL_MASK}, {"HASH_SHIFT", HASH_SHIFT}, {"MAP_EMPTY", MAP_EMPTY},
        {"MAP_TOMBSTONE", MAP_TOMBSTONE}, {"MAX_OCCUPIED_LOAD_PERCENT", (long)(MAX_OCCUPIED_LOAD * 100 + 0.5)},
        {"WRITE_SYSCALL_MIN_BYTES", WRITE_SYSCALL_MIN_BYTES},
        {"TAIL_ROW_COLUMNS", TAIL_ROW_COLUMNS}, {"SCAN_END", SCAN_END}, {"SCAN_PYTHON", SCAN_PYTHON},
        {"SCAN_ROWS_FULL", SCAN_ROWS_FULL}, {"CONTROL_MASK", CONTROL_MASK},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (add_layout(layout, fields[i].name, fields[i].value) < 0) goto error;
    if (PyModule_AddObject(module, "LAYOUT", layout) < 0) goto error;
    layout = NULL;
    if (PyModule_AddIntConstant(module, "HARDWARE_CRC", have_sse42) < 0) goto error;
    /* Past a long: exported on its own. */
    if (PyModule_AddObject(module, "HASH_MULTIPLIER", PyLong_FromUnsignedLongLong(FIB_MULTIPLIER)) < 0) goto error;
    Py_INCREF(&AppenderType);
    if (PyModule_AddObject(module, "Appender", (PyObject *)&AppenderType) < 0) {
        Py_DECREF(&AppenderType);
        goto error;
    }
    Py_INCREF(&AppendMethodType);
    if (PyModule_AddObject(module, "AppendMethod", (PyObject *)&AppendMethodType) < 0) {
        Py_DECREF(&AppendMethodType);
        goto error;
    }
    return module;
error:
    Py_XDECREF(layout);
    Py_DECREF(module);
    return NULL;
}
