import XCTest
import Foundation
import HeraldCore

/// Words of Herald's wire format, for every JSON target.
let wireWords: [String] = [
    "{", "}", "[", "]", ",", ":", "\"", "\\", "true", "false", "null", " ", "\n", "{}", "[]", "\"\"",
    "\"type\"", "\"ref\"", "\"token\"", "\"deviceId\"", "\"platform\"", "\"tags\"", "\"cursor\"", "\"epoch\"",
    "\"id\"", "\"readState\"", "\"userActionState\"", "\"ifVersion\"", "\"hello\"", "\"update\"", "\"delete\"",
    "\"sync\"", "\"refresh\"", "\"ping\"", "\"appNotificationId\"", "\"payload\"", "\"priority\"", "\"groupName\"",
    "\"displayTimeToLive\"", "\"targetPlatforms\"", "\"targetTags\"", "\"expiresAt\"", "\"ttlSeconds\"",
    "\"userIds\"", "\"tagExpression\"", "\"userId\"", "\"read\"", "\"unread\"", "\"noInteraction\"", "\"activated\"",
    "\"dismissed\"", "\"snoozed\"", "\"web\"", "\"ios\"", "\"android\"", "\"windows\"", "\"other\"", "\"normal\"",
    "\"high\"", "\"user:alice\"", "\"platform:ios\"", "\"device:x\"", "\"lang:it\"", "\"2026-11-22T10:00:00.000Z\"",
    "\"2027-02-29T10:00:00Z\"", "\"n_01J00000000000000000000000\"", "\"a && b\"", "\"!(a || b)\"",
    "type", "ref", "token", "hello", "deviceId", "payload", "userIds", "tagExpression", "ttlSeconds", "expiresAt",
]

/// Keys may be canonically equivalent but different (Kelvin sign and K):
/// compare bytes, not Swift String equality, when checking round trips.
func sameBytes(_ a: JSON, _ b: JSON) -> Bool { a.encoded == b.encoded }

final class JSONFuzzTests: XCTestCase {

    static let jsonTarget = FuzzTarget(
        name: "json",
        extraCorpora: ["message", "publish", "bulk", "state", "device", "tokenrequest"],
        dictionary: wireWords,
        jsonAware: true,
        maxLength: 262144,
        check: { bytes in
            let valid = String(validating: bytes, as: UTF8.self) != nil
            let v: JSON
            do throws(JSONError) { v = try JSONParser.parse(bytes) } catch {
                // The 1007 flag must say exactly whether the bytes were UTF-8
                // (the standard library's validator is the oracle).
                if error.invalidUTF8 == valid {
                    return .failed("invalidUTF8=\(error.invalidUTF8) but the standard library says valid=\(valid): \(error.message)")
                }
                if error.message.isEmpty { return .failed("an error without a message") }
                return .rejected
            }
            guard valid else { return .failed("accepted bytes that are not UTF-8") }
            // Whatever is accepted re-encodes and re-parses to an equal value,
            // and the encoding is a fixed point.
            let e1 = v.encoded
            let v2: JSON
            do throws(JSONError) { v2 = try JSONParser.parse(e1) } catch {
                return .failed("its own encoding does not re-parse: \(error.message); encoded=\(String(decoding: e1.prefix(300), as: UTF8.self))")
            }
            guard v2 == v else { return .failed("re-parsed value differs from the first parse") }
            guard v2.encoded == e1 else { return .failed("encoding is not a fixed point") }
            if let why = FoundationOracle.disagreement(bytes, accepted: v) { return .failed(why) }
            return .accepted
        })

    func testFuzzJSONParser() {
        FuzzRunner.run(Self.jsonTarget, test: self)
    }

    /// Linear-ish time: k times the input may cost at most 4k times as much
    /// (quadratic would be k² times; the slack absorbs allocator effects and
    /// a busy machine). Each shape is a known way to be
    /// quadratic: wide objects (key lookup), escapes (string building),
    /// long numbers, deep-but-allowed nesting repeated, duplicate-key
    /// hashing of equivalent keys, invalid UTF-8 at the very end.
    func testParseTimeIsLinearInInputSize() {
        let shapes: [(String, (Int) -> [UInt8])] = [
            ("wide object", { n in Array(("{" + (0..<n).map { "\"k\($0)\":\($0)" }.joined(separator: ",") + "}").utf8) }),
            ("wide array", { n in Array(("[" + (0..<n).map { _ in "1.5e3" }.joined(separator: ",") + "]").utf8) }),
            ("escaped string", { n in Array(("\"" + String(repeating: #"\n\u00e9\ud83d\ude00\\"#, count: n) + "\"").utf8) }),
            ("long number", { n in Array(("1" + String(repeating: "0", count: n * 8) + "e5").utf8) }),
            ("nested 60 repeated", { n in
                let one = String(repeating: "[", count: 60) + String(repeating: "]", count: 60)
                return Array(("[" + Array(repeating: one, count: max(1, n / 16)).joined(separator: ",") + "]").utf8)
            }),
            ("combining keys", { n in
                Array(("{" + (0..<n).map { "\"e\u{301}\u{301}\($0)\":\"\u{212A}\"" }.joined(separator: ",") + "}").utf8)
            }),
            ("non-ASCII string", { n in Array(("\"" + String(repeating: "é€😀", count: n * 2) + "\"").utf8) }),
            ("whitespace", { n in Array((String(repeating: " \n\t\r", count: n * 4) + "0").utf8) }),
            ("invalid UTF-8 at the end", { n in Array(String(repeating: "[1,", count: n).utf8) + [0xFF] }),
            ("unterminated", { n in Array(String(repeating: "[{\"a\":\"", count: 1).utf8) + Array(repeating: 0x61, count: n * 8) }),
        ]
        let small = 2_000, factor = 16
        for (name, make) in shapes {
            let a = make(small), b = make(small * factor)
            let ta = bestTime(a), tb = bestTime(b)
            let ratio = tb / max(ta, 1e-6)
            print(String(format: "[fuzz] linear: %@ %d B %.2f ms → %d B %.2f ms (x%.1f)", name, a.count, ta * 1000, b.count, tb * 1000, ratio))
            let sizeRatio = Double(b.count) / Double(a.count)
            XCTAssertLessThan(ratio, 4 * sizeRatio, "\(name): \(a.count) B took \(ta) s but \(b.count) B took \(tb) s — not linear")
        }
    }

    private func bestTime(_ bytes: [UInt8]) -> Double {
        var best = Double.infinity
        for _ in 0..<3 {
            let s = DispatchTime.now().uptimeNanoseconds
            _ = try? JSONParser.parse(bytes)
            best = min(best, Double(DispatchTime.now().uptimeNanoseconds - s) / 1e9)
        }
        return best
    }
}

/// Foundation's JSONSerialization as an independent second opinion: what
/// Herald accepts, Foundation must accept too (except where Herald is
/// documented to be stricter or Foundation cannot represent a number).
enum FoundationOracle {
    static let enabled = ProcessInfo.processInfo.environment["HERALD_FUZZ_FOUNDATION"] != "0"

    static func disagreement(_ bytes: [UInt8], accepted: JSON) -> String? {
        guard enabled, bytes.count < 64 * 1024 else { return nil }
        if hasNumberFoundationRefuses(accepted) { return nil }
        do {
            _ = try JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed])
            return nil
        } catch {
            return "Herald accepted what Foundation refuses (\(error))"
        }
    }

    private static func hasNumberFoundationRefuses(_ v: JSON) -> Bool {
        switch v {
        case .number(let s):
            // Out of Double range, or more digits than Foundation keeps.
            guard let d = Double(s), d.isFinite else { return true }
            return s.utf8.count > 30
        case .array(let a): return a.contains(where: hasNumberFoundationRefuses)
        case .object(let o): return o.values.contains(where: hasNumberFoundationRefuses)
        default: return false
        }
    }
}
