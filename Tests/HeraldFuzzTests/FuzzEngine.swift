// A seeded, deterministic, coverage-free mutation fuzzer for Herald's
// parsers and validators. No libFuzzer needed: every target runs for a time
// budget (HERALD_FUZZ_SECONDS, default 1.5 s) or an exact number of iterations
// (HERALD_FUZZ_ITERATIONS) from a fixed seed (HERALD_FUZZ_SEED). See
// docs/FUZZING.md.

import XCTest
import HeraldTestSupport
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#else
import Darwin
#endif
import HeraldCore

// MARK: - Configuration

enum FuzzConfig {
    static let env = ProcessInfo.processInfo.environment

    /// Seconds per target.
    static let seconds: Double = env["HERALD_FUZZ_SECONDS"].flatMap(Double.init) ?? 1.5

    /// Exact iterations per target; overrides the time budget (handy to
    /// reproduce a run on another machine).
    static let iterations: Int? = env["HERALD_FUZZ_ITERATIONS"].flatMap { Int($0) }

    /// "Herald" in ASCII. Decimal or 0x-hex.
    static let seed: UInt64 = {
        guard let s = env["HERALD_FUZZ_SEED"]?.trimmingCharacters(in: .whitespaces), !s.isEmpty else {
            return 0x4865_7261_6C64
        }
        if s.lowercased().hasPrefix("0x") { return UInt64(s.dropFirst(2), radix: 16) ?? 0 }
        return UInt64(s) ?? UInt64(truncatingIfNeeded: s.hashValue)
    }()

    /// Whether failing inputs are written into the source corpus (default yes).
    static let writeRegressions = env["HERALD_FUZZ_WRITE"] != "0"

    /// An input that runs longer than this is reported as a hang and the
    /// process is stopped (a stuck test would otherwise hang CI).
    static let hangSeconds: Double = env["HERALD_FUZZ_HANG_SECONDS"].flatMap(Double.init) ?? 10

    /// Largest input a mutator produces (the WebSocket frame limit).
    static let maxInputBytes = 256 * 1024

    /// Where regression inputs are written: the corpus in the source tree.
    static let sourceCorpus: URL = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("corpus")
}

// MARK: - PRNG

/// FNV-1a, for naming regression files.
func fnv1a(_ bytes: [UInt8]) -> UInt64 {
    var h: UInt64 = 0xcbf2_9ce4_8422_2325
    for b in bytes { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
    return h
}

func hexString(_ bytes: [UInt8], limit: Int = 8192) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var out: [UInt8] = []
    out.reserveCapacity(min(bytes.count, limit) * 2)
    for b in bytes.prefix(limit) { out.append(digits[Int(b >> 4)]); out.append(digits[Int(b & 15)]) }
    var s = String(decoding: out, as: UTF8.self)
    if bytes.count > limit { s += "…(\(bytes.count) bytes)" }
    return s
}

func fromHex(_ s: String) -> [UInt8]? {
    let b = Array(s.utf8.filter { $0 != 0x20 && $0 != 0x0A })
    guard b.count % 2 == 0 else { return nil }
    var out: [UInt8] = []
    var i = 0
    while i < b.count {
        guard let v = UInt8(String(decoding: b[i..<i + 2], as: UTF8.self), radix: 16) else { return nil }
        out.append(v); i += 2
    }
    return out
}

// MARK: - Targets

enum Outcome: Sendable {
    /// The input was refused cleanly (an error, as it should be for junk).
    case rejected
    /// The input was accepted and every property held; it joins the pool
    /// of valid inputs that later mutations start from.
    case accepted
    /// A property failed.
    case failed(String)
}

struct FuzzTarget: Sendable {
    /// Also the corpus subdirectory.
    var name: String
    /// Other corpus subdirectories to splice from and start from.
    var extraCorpora: [String] = []
    /// Words the mutators insert and substitute.
    var dictionary: [String] = []
    /// Inputs are JSON: also mutate parsed trees (types, keys, values).
    var jsonAware = false
    /// Longest input the mutators make for this target.
    var maxLength = 64 * 1024
    /// Makes a fresh (usually valid) input; mutated or checked as is.
    var generate: (@Sendable (inout SplitMix64) -> [UInt8])?
    var check: @Sendable ([UInt8]) -> Outcome
}

struct FuzzStats {
    var iterations = 0
    var accepted = 0
    var failures = 0
    var seconds = 0.0
    var corpusFiles = 0
    var slowest = 0.0
    var slowestInput: [UInt8] = []
    var perSecond: Double { seconds > 0 ? Double(iterations) / seconds : 0 }
}

// MARK: - Crash and hang reporting

/// What the fuzz thread is running, for the signal handler and the
/// watchdog. Written before each input; read only when the process is
/// dying (a trap) or stuck (a hang).
nonisolated(unsafe) private var currentInput: UnsafeBufferPointer<UInt8>? = nil
nonisolated(unsafe) private var currentHeader = UnsafeMutablePointer<CChar>.allocate(capacity: 512)
nonisolated(unsafe) private var currentDir = UnsafeMutablePointer<CChar>.allocate(capacity: 4096)
nonisolated(unsafe) private var currentIteration = 0
nonisolated(unsafe) private var currentFile = UnsafeMutablePointer<CChar>.allocate(capacity: 256)
nonisolated(unsafe) private var scratch = UnsafeMutablePointer<UInt8>.allocate(capacity: 8192)
nonisolated(unsafe) private var altStack = UnsafeMutableRawPointer.allocate(byteCount: 1 << 16, alignment: 16)
private let progress = Atomic<Int>(0)
private let busy = Atomic<Bool>(false)
private let installed = Mutex<Bool>(false)

private func rawWrite(_ fd: Int32, _ p: UnsafeRawPointer, _ n: Int) {
    var off = 0
    while off < n {
        let w = write(fd, p + off, n - off)
        if w <= 0 { return }
        off += w
    }
}

private func rawWrite(_ fd: Int32, _ s: StaticString) {
    rawWrite(fd, s.utf8Start, s.utf8CodeUnitCount)
}

private func rawWriteCString(_ fd: Int32, _ p: UnsafePointer<CChar>) {
    rawWrite(fd, p, strlen(p))
}

/// Async-signal-safe as far as it goes: prints the target, seed,
/// iteration and the input in hex to stderr and writes the input into the
/// source corpus as `crash-<fnv>.bin`.
private func reportCurrentInput(_ what: StaticString) {
    rawWrite(2, "\n[fuzz] ")
    rawWrite(2, what)
    rawWrite(2, " ")
    rawWriteCString(2, currentHeader)
    // iteration
    var it = currentIteration, digits = 0
    scratch[0] = 0x30
    if it == 0 { digits = 1 } else { while it > 0 { scratch[digits] = UInt8(0x30 + it % 10); it /= 10; digits += 1 } }
    if currentIteration < 0 {
        // Replaying a corpus file: it is in the corpus already.
        rawWrite(2, " corpus file=")
        rawWriteCString(2, currentFile)
    } else {
        rawWrite(2, " iteration=")
        for k in stride(from: digits - 1, through: 0, by: -1) { rawWrite(2, scratch + k, 1) }
    }
    guard let input = currentInput else { rawWrite(2, "\n"); return }
    rawWrite(2, " input(hex)=")
    let hex: StaticString = "0123456789abcdef"
    let h = hex.utf8Start
    var i = 0
    while i < input.count {
        var n = 0
        while n < 4096, i < input.count {
            scratch[n] = h[Int(input[i] >> 4)]; scratch[n + 1] = h[Int(input[i] & 15)]
            n += 2; i += 1
        }
        rawWrite(2, scratch, n)
    }
    rawWrite(2, "\n")
    guard currentDir[0] != 0, currentIteration >= 0 else { return }
    // <dir>/crash-<fnv64>.bin
    var fnv: UInt64 = 0xcbf2_9ce4_8422_2325
    for b in input { fnv = (fnv ^ UInt64(b)) &* 0x100_0000_01b3 }
    let dirLen = strlen(currentDir)
    guard dirLen < 4000 else { return }
    let path = currentDir + dirLen
    let name: StaticString = "/crash-"
    for k in 0..<name.utf8CodeUnitCount { path[k] = CChar(bitPattern: name.utf8Start[k]) }
    var p = name.utf8CodeUnitCount
    for shift in stride(from: 60, through: 0, by: -4) { path[p] = CChar(bitPattern: h[Int((fnv >> UInt64(shift)) & 15)]); p += 1 }
    for c in ".bin".utf8 { path[p] = CChar(bitPattern: c); p += 1 }
    path[p] = 0
    let fd = open(currentDir, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    if fd >= 0 {
        if let base = input.baseAddress { rawWrite(fd, base, input.count) }
        close(fd)
        rawWrite(2, "[fuzz] wrote ")
        rawWriteCString(2, currentDir)
        rawWrite(2, " (commit it: it is re-run every time)\n")
    }
    path[0] = 0
}

private func installCrashHandlers() {
    let first = installed.withLock { done -> Bool in
        defer { done = true }
        return !done
    }
    guard first else { return }
    // An alternate stack so a stack overflow can still be reported.
    var ss = stack_t()
    ss.ss_sp = altStack
    ss.ss_size = 1 << 16
    ss.ss_flags = 0
    sigaltstack(&ss, nil)
    let handler: @convention(c) (Int32) -> Void = { sig in
        reportCurrentInput("CRASH (signal) while fuzzing")
        signal(sig, SIG_DFL)
        raise(sig)
    }
    for sig in [SIGILL, SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGABRT] {
        var sa = sigaction()
        #if canImport(Glibc)
        sa.__sigaction_handler.sa_handler = handler
        #else
        sa.__sigaction_u.__sa_handler = handler
        #endif
        sa.sa_flags = Int32(SA_ONSTACK)
        sigemptyset(&sa.sa_mask)
        sigaction(sig, &sa, nil)
    }
    // Watchdog: an input that makes no progress for hangSeconds is a hang.
    let t = Thread {
        var last = -1
        var since = Date()
        while true {
            Thread.sleep(forTimeInterval: 0.25)
            let now = progress.load(ordering: .relaxed)
            if now != last || !busy.load(ordering: .relaxed) { last = now; since = Date(); continue }
            if Date().timeIntervalSince(since) > FuzzConfig.hangSeconds {
                reportCurrentInput("HANG (no progress) while fuzzing")
                abort()
            }
        }
    }
    t.name = "herald-fuzz-watchdog"
    t.start()
}

// MARK: - Corpus

enum Corpus {
    /// The files of one corpus subdirectory, sorted by name (deterministic).
    static func load(_ dir: String) -> [(name: String, bytes: [UInt8])] {
        guard let root = Bundle.module.url(forResource: "corpus", withExtension: nil) else { return [] }
        let url = root.appendingPathComponent(dir)
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: url.path) else { return [] }
        return names.sorted().filter { !$0.hasPrefix(".") }.compactMap { n in
            guard let d = FileManager.default.contents(atPath: url.appendingPathComponent(n).path) else { return nil }
            return (n, [UInt8](d))
        }
    }

    /// Writes a failing input into the source corpus; answers its path.
    @discardableResult
    static func writeRegression(_ dir: String, _ bytes: [UInt8], prefix: String = "regress") -> String? {
        guard FuzzConfig.writeRegressions else { return nil }
        let d = FuzzConfig.sourceCorpus.appendingPathComponent(dir)
        try? FileManager.default.createDirectory(at: d, withIntermediateDirectories: true)
        let name = "\(prefix)-\(String(fnv1a(bytes), radix: 16)).bin"
        let url = d.appendingPathComponent(name)
        guard (try? Data(bytes).write(to: url)) != nil else { return nil }
        return url.path
    }
}

// MARK: - Mutation

struct Mutator {
    var rng: SplitMix64
    let dictionary: [[UInt8]]
    let jsonAware: Bool
    var maxLength = FuzzConfig.maxInputBytes

    static let interestingBytes: [UInt8] = [
        0x00, 0x01, 0x08, 0x09, 0x0A, 0x0D, 0x1F, 0x20, 0x22, 0x27, 0x2B, 0x2C, 0x2D, 0x2E, 0x2F, 0x30, 0x31, 0x39,
        0x3A, 0x40, 0x45, 0x5B, 0x5C, 0x5D, 0x65, 0x66, 0x6E, 0x74, 0x75, 0x7B, 0x7C, 0x7D, 0x21, 0x26, 0x28, 0x29,
        0x25, 0x3F, 0x23, 0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFE, 0xFF,
    ]

    static let interestingNumbers: [String] = [
        "0", "-0", "1", "-1", "2", "7", "8", "59", "60", "61", "127", "128", "255", "256", "1000", "1001", "3600",
        "65535", "65536", "2592000", "2592001", "31536000", "31536001", "2147483647", "2147483648", "-2147483649",
        "4294967296", "9223372036854775", "9223372036854776", "-9223372036854776", "18446744073709552",
        "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
        "18446744073709551615", "18446744073709551616", "1e400", "-1e400", "1e-400", "1E+2", "1e2", "0.0", "1.5",
        "-0.0", "0e0", "1.0", "00", "01", "-", "1.", ".5", "1e", "1e+", "+1", "0x10", "NaN", "Infinity", "-Infinity",
        "1" + String(repeating: "0", count: 400), "0." + String(repeating: "0", count: 400) + "1",
        "1e" + String(repeating: "9", count: 40),
    ]

    static let utf8Edges: [[UInt8]] = [
        [0xC0, 0x80], [0xC1, 0xBF], [0xE0, 0x80, 0x80], [0xED, 0xA0, 0x80], [0xED, 0xBF, 0xBF], [0xF4, 0x90, 0x80, 0x80],
        [0xF5, 0x80, 0x80, 0x80], [0xF8, 0x88, 0x80, 0x80, 0x80], [0x80], [0xBF], [0xE2, 0x82], [0xF0, 0x9F, 0x98],
        [0xEF, 0xBB, 0xBF], [0xEF, 0xBF, 0xBF], [0xEF, 0xBF, 0xBD], [0xF4, 0x8F, 0xBF, 0xBF], [0xCC, 0x81],
        [0xE2, 0x84, 0xAA], [0xCD, 0xBE], [0xE2, 0x80, 0x8D], [0xE2, 0x80, 0xA8], [0xC2, 0xA0], [0xC3, 0xA9],
        [0x65, 0xCC, 0x81], [0xF0, 0x9F, 0x91, 0xA9, 0xE2, 0x80, 0x8D, 0xF0, 0x9F, 0x92, 0xBB], [0xFF], [0xFE],
        Array(#"\u0000"#.utf8), Array(#"\ud800"#.utf8), Array(#"\udc00"#.utf8), Array(#"\ud83d\ude00"#.utf8),
        Array(#"\ud800\u0041"#.utf8), Array(#"\uDBFF\uDFFF"#.utf8), Array(#"\u00e9"#.utf8), Array(#"\u0301"#.utf8),
        Array(#"\u212a"#.utf8), Array(#"\u"#.utf8), Array(#"\u12"#.utf8), Array(#"\x41"#.utf8), Array(#"\/"#.utf8),
        Array("%00".utf8), Array("%2F".utf8), Array("%CC%81".utf8),
    ]

    init(seed: UInt64, dictionary: [String], jsonAware: Bool) {
        rng = SplitMix64(seed: seed)
        self.dictionary = dictionary.map { Array($0.utf8) }
        self.jsonAware = jsonAware
    }

    /// 1 to 8 stacked mutations (or a JSON tree mutation) of `input`.
    mutating func mutate(_ input: [UInt8], other: () -> [UInt8]) -> [UInt8] {
        var d = input
        if jsonAware, rng.oneIn(3), let v = try? JSONParser.parse(d) {
            var t = v
            for _ in 0..<rng.powerLaw(4) { t = mutateTree(t, depth: 0) }
            d = t.encoded
            if rng.oneIn(2) { return d }
        }
        for _ in 0..<rng.powerLaw(8) {
            mutateOnce(&d, other: other)
            if d.count > maxLength { d.removeLast(d.count - maxLength) }
        }
        return d
    }

    private mutating func pos(_ d: [UInt8]) -> Int { rng.below(d.count + 1) }

    private mutating func word() -> [UInt8] {
        if !dictionary.isEmpty, rng.below(3) != 0 { return rng.pick(dictionary) }
        switch rng.below(3) {
        case 0: return Array(rng.pick(Mutator.interestingNumbers).utf8)
        case 1: return rng.pick(Mutator.utf8Edges)
        default: return [rng.pick(Mutator.interestingBytes)]
        }
    }

    mutating func mutateOnce(_ d: inout [UInt8], other: () -> [UInt8]) {
        switch rng.below(22) {
        case 0, 1: // bit flip
            guard !d.isEmpty else { d.append(rng.byte()); return }
            d[rng.below(d.count)] ^= 1 << UInt8(rng.below(8))
        case 2: // random byte
            guard !d.isEmpty else { return }
            d[rng.below(d.count)] = rng.byte()
        case 3, 4: // interesting byte, set or insert
            let b = rng.pick(Mutator.interestingBytes)
            if !d.isEmpty, rng.oneIn(2) { d[rng.below(d.count)] = b } else { d.insert(b, at: pos(d)) }
        case 5: // insert random bytes
            let n = rng.powerLaw(16)
            d.insert(contentsOf: (0..<n).map { _ in rng.byte() }, at: pos(d))
        case 6, 7: // delete a range
            guard !d.isEmpty else { return }
            let a = rng.below(d.count)
            d.removeSubrange(a..<min(d.count, a + rng.powerLaw(32)))
        case 8: // duplicate a range
            guard !d.isEmpty else { return }
            let a = rng.below(d.count), n = min(d.count - a, rng.powerLaw(64))
            let chunk = Array(d[a..<a + n])
            for _ in 0..<rng.powerLaw(4) { d.insert(contentsOf: chunk, at: pos(d)) }
        case 9: // truncate
            guard !d.isEmpty else { return }
            d.removeSubrange(rng.below(d.count)...)
        case 10, 11: // splice with another corpus entry
            let o = other()
            guard !o.isEmpty else { return }
            if rng.oneIn(2) {
                let a = pos(d), b = rng.below(o.count + 1)
                d = Array(d[..<a]) + Array(o[b...])
            } else {
                let b = rng.below(o.count), n = min(o.count - b, rng.powerLaw(64))
                d.insert(contentsOf: o[b..<b + n], at: pos(d))
            }
        case 12, 13: // dictionary word: insert or overwrite a token
            let w = word()
            if rng.oneIn(2) || d.isEmpty {
                d.insert(contentsOf: w, at: pos(d))
            } else {
                let a = rng.below(d.count)
                d.replaceSubrange(a..<min(d.count, a + rng.range(1, max(1, w.count))), with: w)
            }
        case 14: // interesting number replaces a run of digits (or lands anywhere)
            let n = Array(rng.pick(Mutator.interestingNumbers).utf8)
            let digitsAt = d.indices.filter { d[$0] >= 0x30 && d[$0] <= 0x39 }
            if let s = digitsAt.isEmpty ? nil : rng.pick(digitsAt) {
                var e = s
                while e < d.count, (d[e] >= 0x30 && d[e] <= 0x39) || d[e] == 0x2E || d[e] == 0x65 || d[e] == 0x2D { e += 1 }
                var b = s
                while b > 0, (d[b - 1] >= 0x30 && d[b - 1] <= 0x39) || d[b - 1] == 0x2D { b -= 1 }
                d.replaceSubrange(b..<e, with: n)
            } else {
                d.insert(contentsOf: n, at: pos(d))
            }
        case 15: // UTF-8 edge sequence
            let e = rng.pick(Mutator.utf8Edges)
            if !d.isEmpty, rng.oneIn(3) {
                let a = rng.below(d.count)
                d.replaceSubrange(a..<min(d.count, a + e.count), with: e)
            } else {
                d.insert(contentsOf: e, at: pos(d))
            }
        case 16: // deep nesting
            let depth = rng.pick([8, 31, 32, 33, 63, 64, 65, 66, 128, 1000, 5000])
            let open: [UInt8]
            let close: [UInt8]
            switch rng.below(5) {
            case 0: open = Array("[".utf8); close = Array("]".utf8)
            case 1: open = Array(#"{"a":"#.utf8); close = Array("}".utf8)
            case 2: open = Array("(".utf8); close = Array(")".utf8)
            case 3: open = Array("!".utf8); close = []
            default: open = Array(#"[{"x":"#.utf8); close = Array("}]".utf8)
            }
            let a = pos(d)
            var mid: [UInt8] = []
            mid.reserveCapacity(depth * (open.count + close.count) + 1)
            for _ in 0..<depth { mid += open }
            let inner = min(d.count - a, rng.powerLaw(16))
            mid += d[a..<a + inner]
            if rng.below(4) != 0 { for _ in 0..<depth { mid += close } }
            d.replaceSubrange(a..<a + inner, with: mid)
        case 17: // long run of one byte or word
            let unit: [UInt8] = rng.oneIn(2) ? [rng.pick(Mutator.interestingBytes.filter { $0 >= 0x20 && $0 < 0x7F })] : word()
            let n = min(maxLength, rng.oneIn(4) ? rng.pick([4097, 8193, 65_537]) : rng.pick([32, 64, 129, 161, 257, 1025]))
            var run: [UInt8] = []
            run.reserveCapacity(n * unit.count)
            for _ in 0..<n { run += unit }
            if run.count > maxLength { run.removeLast(run.count - maxLength) }
            d.insert(contentsOf: run, at: pos(d))
        case 18: // long JSON string
            let n = min(maxLength, rng.oneIn(4) ? rng.pick([4096, 8193, 65_536, 70_000]) : rng.pick([128, 129, 256, 257, 1024]))
            let esc = rng.oneIn(3)
            var s: [UInt8] = [0x22]
            for k in 0..<n { s += esc && k % 7 == 0 ? Array(#"\n"#.utf8) : [0x61] }
            s.append(0x22)
            d.insert(contentsOf: s, at: pos(d))
        case 19: // swap two ranges
            guard d.count > 2 else { return }
            let a = rng.below(d.count), b = rng.below(d.count)
            d.swapAt(a, b)
        case 20: // increment / decrement an ASCII digit or letter
            guard !d.isEmpty else { return }
            let i = rng.below(d.count)
            d[i] = rng.oneIn(2) ? d[i] &+ 1 : d[i] &- 1
        default: // whole replacement by another entry's tail
            let o = other()
            if !o.isEmpty { d = Array(o[rng.below(o.count)...]) }
        }
    }

    // MARK: JSON trees

    private mutating func interestingValue(depth: Int) -> JSON {
        switch rng.below(14) {
        case 0: return .null
        case 1: return .bool(rng.oneIn(2))
        case 2, 3: return .number(rng.pick(Mutator.interestingNumbers.filter { JSONNumber.isValid($0) }))
        case 4: return .string("")
        case 5: return .string(String(repeating: rng.pick(["a", "é", "\u{301}", ":", "\u{0}", "\""]), count: rng.pick([1, 64, 128, 129, 160, 161, 256, 257, 1025, 4097, 8193])))
        case 6, 7:
            if !dictionary.isEmpty { return .string(String(decoding: rng.pick(dictionary), as: UTF8.self)) }
            return .string("x")
        case 8: return .array([])
        case 9: return .object(JSONObject())
        case 10:
            var v: JSON = .number("1")
            for _ in 0..<rng.pick([1, 3, 62, 63, 64, 65, 70]) { v = rng.oneIn(2) ? .array([v]) : .object(["a": v]) }
            return v
        case 11:
            let n = rng.pick([2, 20, 21, 60, 61, 999, 1000, 1001])
            return .array((0..<n).map { k in .string(rng.oneIn(8) ? "u\(k % 3)" : "u\(k)") })
        case 12: return .string(String(decoding: rng.pick(Mutator.utf8Edges), as: UTF8.self))
        default:
            guard depth < 3 else { return .null }
            var o = JSONObject()
            for _ in 0..<rng.below(4) { o[key()] = interestingValue(depth: depth + 1) }
            return .object(o)
        }
    }

    private mutating func key() -> String {
        if !dictionary.isEmpty, rng.below(4) != 0 { return String(decoding: rng.pick(dictionary), as: UTF8.self) }
        return rng.pick(["", "x", "type", "ref", "\u{212A}", "e\u{301}", "\u{e9}", "extra", "__proto__"])
    }

    mutating func mutateTree(_ v: JSON, depth: Int) -> JSON {
        // Descend into a child two times in three, else change this node.
        switch v {
        case .object(var o) where o.count > 0 && rng.below(3) != 0 && depth < 70:
            let k = o.keys[rng.below(o.count)]
            o[k] = mutateTree(o[k]!, depth: depth + 1)
            return .object(o)
        case .array(var a) where !a.isEmpty && rng.below(3) != 0 && depth < 70:
            let i = rng.below(a.count)
            a[i] = mutateTree(a[i], depth: depth + 1)
            return .array(a)
        case .object(var o):
            switch rng.below(6) {
            case 0 where o.count > 0: o[o.keys[rng.below(o.count)]] = nil
            case 1: o[key()] = interestingValue(depth: 0)
            case 2 where o.count > 0:
                let k = o.keys[rng.below(o.count)]
                let val = o[k]!
                o[k] = nil
                o[key()] = val
            case 3 where o.count > 1: // reorder
                let ks = o.keys, vs = o.values
                var p = JSONObject()
                for i in (0..<ks.count).reversed() { p[ks[i]] = vs[i] }
                o = p
            case 4 where o.count > 0: // wrong type for a known field
                o[o.keys[rng.below(o.count)]] = interestingValue(depth: 0)
            default: return interestingValue(depth: depth)
            }
            return .object(o)
        case .array(var a):
            switch rng.below(4) {
            case 0 where !a.isEmpty: a.remove(at: rng.below(a.count))
            case 1 where !a.isEmpty: a.append(a[rng.below(a.count)])
            case 2: a.append(interestingValue(depth: 0))
            default: return interestingValue(depth: depth)
            }
            return .array(a)
        case .string(let s) where rng.oneIn(2):
            var b = Array(s.utf8)
            mutateOnce(&b, other: { [] })
            return .string(String(decoding: b, as: UTF8.self))
        default:
            return interestingValue(depth: depth)
        }
    }
}

enum JSONNumber {
    /// RFC 8259 number grammar (so tree mutations only build valid JSON).
    static func isValid(_ s: String) -> Bool { (try? JSONParser.parse(s)).map { if case .number = $0 { true } else { false } } ?? false }
}

// MARK: - The runner

enum FuzzRunner {
    /// A per-target seed: the run seed mixed with the target's name.
    static func seed(for name: String) -> UInt64 {
        var r = SplitMix64(seed: FuzzConfig.seed ^ fnv1a(Array(name.utf8)))
        return r.next()
    }

    /// Replays the corpus, then fuzzes for the budget. Reports failures
    /// through XCTFail with the seed and the input in hex.
    /// Runs `t` in a child process (the same test binary, filtered to the
    /// calling test) so that a trap or hang in one target is reported as
    /// that target's failure and the other targets still run. In the child
    /// (or with HERALD_FUZZ_INPROCESS=1, or off Linux) it runs in-process.
    static func run(_ t: FuzzTarget, test: XCTestCase, function: String = #function,
                    file: StaticString = #filePath, line: UInt = #line) {
        #if os(Linux)
        let env = ProcessInfo.processInfo.environment
        if env["HERALD_FUZZ_CHILD"] == nil, env["HERALD_FUZZ_INPROCESS"] != "1" {
            let name = "HeraldFuzzTests.\(type(of: test))/\(function.replacingOccurrences(of: "()", with: ""))"
            runChild(name, target: t.name, file: file, line: line)
            return
        }
        #endif
        runInProcess(t, file: file, line: line)
    }

    static func runChild(_ testName: String, target: String, file: StaticString, line: UInt) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: CommandLine.arguments[0])
        p.arguments = [testName]
        var env = ProcessInfo.processInfo.environment
        env["HERALD_FUZZ_CHILD"] = "1"
        p.environment = env
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        do { try p.run() } catch {
            XCTFail("[fuzz] \(target): cannot start the child process (\(error)); set HERALD_FUZZ_INPROCESS=1", file: file, line: line)
            return
        }
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        // The child's own report: stats, failures, crash details.
        for l in lines where l.hasPrefix("[fuzz]") || l.contains("error:") || l.hasPrefix("  ") && l.contains("input(hex)") {
            print(l)
        }
        switch p.terminationReason {
        case .uncaughtSignal:
            // Keep the runtime's reason and the crashed thread's frames.
            var report: [Substring] = []
            var inCrash = false
            for l in lines {
                if l.contains("Fatal error") || l.contains("runtime failure") || l.hasPrefix("[fuzz] CRASH") || l.hasPrefix("[fuzz] HANG") || l.contains("[fuzz] wrote") { report.append(l) }
                if l.contains("crashed:") { inCrash = true; report.append(l); continue }
                if inCrash { if l.hasPrefix("Thread ") || l.hasPrefix("Registers") { inCrash = false } else if !l.isEmpty { report.append(l) } }
            }
            XCTFail("[fuzz] \(target): the child process died with signal \(p.terminationStatus) (a crash or a hang):\n"
                + report.prefix(40).joined(separator: "\n"), file: file, line: line)
        case .exit where p.terminationStatus != 0:
            XCTFail("[fuzz] \(target): failed in the child process (exit \(p.terminationStatus)); its failures are printed above", file: file, line: line)
        default: break
        }
    }

    @discardableResult
    static func runInProcess(_ t: FuzzTarget, file: StaticString = #filePath, line: UInt = #line) -> FuzzStats {
        installCrashHandlers()
        var stats = FuzzStats()
        let own = Corpus.load(t.name)
        let others = t.extraCorpora.flatMap { Corpus.load($0) }
        stats.corpusFiles = own.count
        let seed = seed(for: t.name)
        setCurrent(target: t.name)
        defer { currentDir[0] = 0; busy.store(false, ordering: .relaxed) }

        func runOne(_ input: [UInt8], iteration: Int) -> Outcome {
            currentIteration = iteration
            progress.add(1, ordering: .relaxed)
            busy.store(true, ordering: .relaxed)
            let start = DispatchTime.now().uptimeNanoseconds
            let o = input.withUnsafeBufferPointer { p -> Outcome in
                currentInput = p
                defer { currentInput = nil }
                return t.check(input)
            }
            busy.store(false, ordering: .relaxed)
            let dt = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
            if dt > stats.slowest { stats.slowest = dt; stats.slowestInput = input }
            return o
        }

        /// One report per kind of failure: digits (ids, values) do not count.
        func kind(_ why: String) -> String {
            String(why.unicodeScalars.filter { !("0"..."9").contains($0) }.prefix(80).map(Character.init))
        }
        var seenFailures = Set<String>()

        // 1. Every corpus entry, including earlier regressions.
        for (name, bytes) in own {
            _ = name.withCString { strncpy(currentFile, $0, 255) }
            currentFile[255] = 0
            if case .failed(let why) = runOne(bytes, iteration: -1) {
                stats.failures += 1
                // Known already: the fuzz loop below does not write it again.
                seenFailures.insert(kind(why))
                XCTFail("[fuzz] \(t.name): corpus file \(name) fails: \(why)\n  input(hex)=\(hexString(bytes))", file: file, line: line)
            }
        }

        // 2. Mutations for the budget.
        var mut = Mutator(seed: seed, dictionary: t.dictionary, jsonAware: t.jsonAware)
        mut.maxLength = min(t.maxLength, FuzzConfig.maxInputBytes)
        let bases = own.map(\.bytes) + others.map(\.bytes)
        var pool: [[UInt8]] = []
        let known = seenFailures.count
        let start = Date()
        let deadline = start.addingTimeInterval(FuzzConfig.seconds)
        var pickRng = SplitMix64(seed: seed ^ 0x5EED_5EED)
        func other() -> [UInt8] {
            let all = bases.count + pool.count
            guard all > 0 else { return [] }
            let k = pickRng.below(all)
            return k < bases.count ? bases[k] : pool[k - bases.count]
        }
        var i = 0
        while true {
            if let n = FuzzConfig.iterations { if i >= n { break } } else if i & 63 == 0, Date() >= deadline { break }
            let input: [UInt8]
            let roll = mut.rng.below(10)
            if let g = t.generate, roll < 3 || bases.isEmpty {
                let fresh = g(&mut.rng)
                input = mut.rng.oneIn(2) ? fresh : mut.mutate(fresh, other: other)
            } else {
                let base: [UInt8]
                if !pool.isEmpty, roll < 6 { base = pool[mut.rng.below(pool.count)] }
                else { base = bases.isEmpty ? [] : bases[mut.rng.below(bases.count)] }
                input = mut.mutate(base, other: other)
            }
            let o = runOne(input, iteration: i)
            i += 1
            switch o {
            case .rejected: break
            case .accepted:
                stats.accepted += 1
                if pool.count < 512 { pool.append(input) } else { pool[mut.rng.below(512)] = input }
            case .failed(let why):
                stats.failures += 1
                if seenFailures.insert(kind(why)).inserted {
                    let path = Corpus.writeRegression(t.name, input)
                    let msg = "[fuzz] \(t.name): \(why)\n  seed=0x\(String(FuzzConfig.seed, radix: 16)) iteration=\(i - 1)"
                        + "\n  input(hex)=\(hexString(input))"
                        + (path.map { "\n  written to \($0) (commit it: it is re-run every time)" } ?? "")
                    XCTFail(msg, file: file, line: line)
                }
            }
            if seenFailures.count - known >= 5 { break }
        }
        stats.iterations = i
        stats.seconds = Date().timeIntervalSince(start)
        print(String(format: "[fuzz] %@: %d iterations in %.2f s (%.0f/s), %d accepted, %d corpus files, %d failures, slowest input %.1f ms (%d bytes), seed 0x%@",
                     t.name, stats.iterations, stats.seconds, stats.perSecond, stats.accepted, stats.corpusFiles,
                     stats.failures, stats.slowest * 1000, stats.slowestInput.count, String(FuzzConfig.seed, radix: 16)))
        return stats
    }

    private static func setCurrent(target: String) {
        let header = "target=\(target) seed=0x\(String(FuzzConfig.seed, radix: 16))"
        _ = header.withCString { strncpy(currentHeader, $0, 511) }
        currentHeader[511] = 0
        let dir = FuzzConfig.writeRegressions ? FuzzConfig.sourceCorpus.appendingPathComponent(target).path : ""
        _ = dir.withCString { strncpy(currentDir, $0, 3000) }
        currentDir[3000] = 0
    }
}

