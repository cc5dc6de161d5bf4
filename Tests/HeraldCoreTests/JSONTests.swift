import XCTest
import Dispatch
@testable import HeraldCore

final class JSONTests: XCTestCase {

    // MARK: round trip

    func testKeyOrderIsKeptThroughParseAndEncode() {
        let text = #"{"zeta":1,"alpha":2,"mid":{"b":true,"a":false},"list":[3,2,1],"n":null}"#
        let v = json(text)
        XCTAssertEqual(v.objectValue?.keys, ["zeta", "alpha", "mid", "list", "n"])
        XCTAssertEqual(v.objectValue?["mid"]?.objectValue?.keys, ["b", "a"])
        XCTAssertEqual(v.encodedString, text)
    }

    func testNumberLiteralsRoundTripExactly() {
        for lit in ["0", "-0", "1", "-1", "0.5", "-0.50", "1.0", "1e10", "1E10", "1e+10", "1e-10", "1.25E-7",
                    "12345678901234567890123", "1e400", "-9223372036854775808", "9223372036854775807",
                    "3.141592653589793238462643383279"] {
            XCTAssertEqual(json(lit), .number(lit), lit)
            XCTAssertEqual(json("[\(lit)]").encodedString, "[\(lit)]", lit)
            XCTAssertEqual(json(#"{"n":\#(lit)}"#).encodedString, #"{"n":\#(lit)}"#, lit)
        }
    }

    func testWhitespaceAroundValuesIsAllowedAndDropped() {
        let v = json(" \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" : \"x\" } \n")
        XCTAssertEqual(v.encodedString, #"{"a":[1,2],"b":"x"}"#)
    }

    func testInt64Value() {
        XCTAssertEqual(json("42").int64Value, 42)
        XCTAssertEqual(json("-7").int64Value, -7)
        XCTAssertEqual(json("9223372036854775807").int64Value, Int64.max)
        XCTAssertNil(json("9223372036854775808").int64Value)
        XCTAssertNil(json("1.0").int64Value)
        XCTAssertNil(json("1e3").int64Value)
        XCTAssertNil(json(#""5""#).int64Value)
        XCTAssertNil(json("true").int64Value)
    }

    func testAccessors() {
        let v = json(#"{"s":"x","b":true,"a":[1],"o":{},"n":null}"#)
        let o = v.objectValue!
        XCTAssertEqual(o["s"]?.stringValue, "x")
        XCTAssertEqual(o["b"]?.boolValue, true)
        XCTAssertEqual(o["a"]?.arrayValue, [.number("1")])
        XCTAssertEqual(o["o"]?.objectValue?.count, 0)
        XCTAssertEqual(o["n"]?.isNull, true)
        XCTAssertNil(o["missing"])
        XCTAssertNil(o["s"]?.boolValue)
        XCTAssertNil(o["b"]?.stringValue)
    }

    func testJSONObjectSubscriptSetReplacesInPlaceAndRemoves() {
        var o: JSONObject = ["a": 1, "b": 2, "c": 3]
        o["b"] = "x"
        XCTAssertEqual(o.keys, ["a", "b", "c"])
        o["a"] = nil
        XCTAssertEqual(o.keys, ["b", "c"])
        o["d"] = true
        XCTAssertEqual(JSON.object(o).encodedString, #"{"b":"x","c":3,"d":true}"#)
    }

    // MARK: escapes

    func testEscapesDecode() {
        XCTAssertEqual(json(#""\"\\\/\b\f\n\r\t""#), .string("\"\\/\u{08}\u{0C}\n\r\t"))
        XCTAssertEqual(json(#""\u0041\u00e9\u00E9\u4e2d""#), .string("Aéé中"))
        XCTAssertEqual(json(#""\u0000""#), .string("\u{0}"))
        XCTAssertEqual(json(#""\ud83d\ude00""#), .string("😀"))
        XCTAssertEqual(json(#""\uD83D\uDE00""#), .string("😀"))
        XCTAssertEqual(json(#""a\nb""#), .string("a\nb"))
        XCTAssertEqual(json(#""plain é 中 😀""#), .string("plain é 中 😀"))
        XCTAssertEqual(json(#""\uFFFF""#), .string("\u{FFFF}"))
    }

    func testEscapedKeysAreDecoded() {
        let v = json(#"{"\u0061b":1}"#)
        XCTAssertEqual(v.objectValue?.keys, ["ab"])
    }

    func testBadEscapesAreRefused() {
        for s in [#""\x""#, #""\U0041""#, #""\u12""#, #""\u12G4""#, #""\u""#, #""\'""#, #""\a""#, #""\0""#,
                  "\"\\", "\"\\u00"] {
            XCTAssertNotNil(jsonError(s), s)
        }
    }

    func testLoneSurrogateEscapesAreRefused() {
        for s in [#""\ud800""#, #""\udbff""#, #""\udc00""#, #""\udfff""#, #""\ud800\u0041""#, #""\ud800x""#,
                  #""\ud800\ud800""#, #""\ude00\ud83d""#, #""\ud800\""#, #""a\ud83d""#, #""\ud83d\n""#] {
            let e = jsonError(s)
            XCTAssertNotNil(e, s)
            XCTAssertEqual(e?.invalidUTF8, false, s)
        }
    }

    // MARK: strict rejections

    func testTrailingCommasAreRefused() {
        for s in ["[1,]", #"{"a":1,}"#, "[1,2,,3]", "[,1]", "{,}", #"{"a":1,,"b":2}"#, "[,]"] {
            XCTAssertNotNil(jsonError(s), s)
        }
    }

    func testLeadingZerosAndBadNumbersAreRefused() {
        for s in ["01", "-01", "00", "[00]", #"{"a":012}"#, "1.", ".5", "+1", "1e", "1e+", "1E-", "-", "--1",
                  "-a", "1.e5", "0x10", "NaN", "Infinity", "-Infinity", "1_000", "[1 2]", "0.1.2", "1ee5"] {
            XCTAssertNotNil(jsonError(s), s)
        }
    }

    func testBareControlCharactersInStringsAreRefused() {
        for c in Array(UInt8(0)..<0x20) {
            XCTAssertNotNil(jsonError([0x22, 0x61, c, 0x62, 0x22]), "byte \(c)")
            // also after an escape (the slow path)
            XCTAssertNotNil(jsonError([0x22, 0x5C, 0x6E, c, 0x22]), "byte \(c) after escape")
            // and in a key
            XCTAssertNotNil(jsonError(bytes("{\"") + [c] + bytes("\":1}")), "byte \(c) in key")
        }
        // DEL is not a control character for JSON.
        XCTAssertEqual(try JSONParser.parse([0x22, 0x7F, 0x22]), .string("\u{7F}"))
    }

    func testBadLiteralsAndStructureAreRefused() {
        for s in ["", " ", "\n", "tru", "nul", "fals", "True", "NULL", "truex", "nulls", "'a'", "{a:1}", "{'a':1}",
                  #"{"a"}"#, #"{"a" 1}"#, #"{"a":}"#, #"{1:2}"#, "[", "]", "{", "}", "[}", "{]", #"{"a":1]"#,
                  "[1}", "/* c */ 1", "1 // c", "\u{FEFF}1", "\u{0C}1", "\u{A0}1", "\"abc", "[\"a\" \"b\"]"] {
            XCTAssertNotNil(jsonError(s), s.debugDescription)
        }
    }

    func testTrailingGarbageIsRefused() {
        for s in ["{} {}", "[] x", "1 2", "true false", "\"a\"\"b\"", "{}}", "[]]", "null,", "{}\u{0}", "0 0"] {
            XCTAssertNotNil(jsonError(s), s.debugDescription)
        }
        XCTAssertNotNil(json("{} \n\t\r"))
    }

    func testDuplicateKeysAreRefused() {
        for s in [#"{"a":1,"a":2}"#, #"{"a":1,"b":2,"a":1}"#, #"{"x":{"a":1,"a":1}}"#, #"[{"a":null,"a":null}]"#,
                  #"{"a":1,"\u0061":2}"#] {
            XCTAssertNotNil(jsonError(s), s)
        }
        // Same key in different objects is fine.
        XCTAssertNotNil(json(#"{"a":{"a":1},"b":{"a":2}}"#).objectValue)
        // Around the width where a set takes over from the scan of the keys.
        for n in 14...18 {
            let keys = (0..<n).map { "\"k\($0)\":\($0)" }
            XCTAssertNotNil(json("{" + keys.joined(separator: ",") + "}").objectValue, "\(n) distinct keys")
            for dup in [0, n - 1] {
                let text = "{" + keys.joined(separator: ",") + ",\"k\(dup)\":0}"
                XCTAssertNotNil(jsonError(text), "k\(dup) again after \(n) keys")
            }
        }
    }

    func testNestingLimit() {
        let limit = JSONParser.defaultMaxDepth
        XCTAssertNil(jsonError(String(repeating: "[", count: limit) + String(repeating: "]", count: limit)),
                     "exactly the limit parses")
        XCTAssertNotNil(jsonError(String(repeating: "[", count: limit + 1) + String(repeating: "]", count: limit + 1)))
        let objs = String(repeating: #"{"a":"#, count: limit + 1) + "1" + String(repeating: "}", count: limit + 1)
        XCTAssertNotNil(jsonError(objs))
        let okObjs = String(repeating: #"{"a":"#, count: limit) + "1" + String(repeating: "}", count: limit)
        XCTAssertNil(jsonError(okObjs))
        // Mixed nesting counts too.
        let mixed = String(repeating: #"[{"a":"#, count: limit / 2 + 1) + "1" + String(repeating: "}]", count: limit / 2 + 1)
        XCTAssertNotNil(jsonError(mixed))
        // A custom limit.
        XCTAssertNil(jsonError(bytes("[[1]]"), maxDepth: 2))
        XCTAssertNotNil(jsonError(bytes("[[[1]]]"), maxDepth: 2))
    }

    func testVeryDeepNestingThrowsWithoutCrashing() {
        for open in ["[", #"{"a":"#, "[{\"k\":"] {
            let s = String(repeating: open, count: 200_000)
            XCTAssertNotNil(jsonError(s))
        }
    }

    func testEveryStrictPrefixOfAValidDocumentThrows() {
        let doc = #"{"a":[1,-2.5e+3,0,true,false,null,"x\u00e9\n\"",{}],"b":{"c":"é中😀","d":[]},"e":-0.0E-1}"#
        let b = bytes(doc)
        XCTAssertNotNil(json(doc).objectValue)
        for n in 0..<b.count {
            XCTAssertNotNil(jsonError(Array(b[0..<n])), "prefix of \(n) bytes parsed")
        }
    }

    func testRandomMutationsNeverCrash() {
        let doc = bytes(#"{"a":[1,-2.5e+3,true,null,"x\u00e9\ud83d\ude00"],"b":{"c":"é"}}"#)
        var rng = SystemRandomNumberGenerator()
        let alphabet = bytes("{}[]\",:\\u0123456789eE+-.tfn ") + [0x00, 0x1F, 0x80, 0xC0, 0xED, 0xF4, 0xFF]
        for _ in 0..<3000 {
            var m = doc
            for _ in 0..<Int.random(in: 1...4, using: &rng) {
                let i = Int.random(in: 0..<m.count, using: &rng)
                switch Int.random(in: 0..<3, using: &rng) {
                case 0: m[i] = alphabet.randomElement(using: &rng)!
                case 1: m.remove(at: i)
                default: m.insert(alphabet.randomElement(using: &rng)!, at: i)
                }
                if m.isEmpty { m = [0x7B] }
            }
            if let v = try? JSONParser.parse(m) {
                // Whatever parses re-encodes to something that parses to the same value.
                XCTAssertEqual(try? JSONParser.parse(v.encoded), v)
            }
        }
    }

    /// A payload may be any object up to 64 KiB encoded, and bodies up to the
    /// gateway's body limit are parsed before any field is looked at, so
    /// parsing must stay roughly linear in the number of keys: a wide object
    /// must not cost a quadratic duplicate-key scan.
    func testWideObjectParsesInLinearTime() {
        var s = "{"
        var k = 0
        while s.utf8.count < 64 * 1024 - 16 { if k > 0 { s += "," }; s += "\"\(k)\":0"; k += 1 }
        s += "}"
        let b = bytes(s)
        let start = DispatchTime.now().uptimeNanoseconds
        let v = try? JSONParser.parse(b)
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
        XCTAssertEqual(v?.objectValue?.count, k)
        XCTAssertLessThan(seconds, 0.5, "parsing a 64 KiB object of \(k) keys took \(seconds) s")
        // Duplicates are still caught at the far end of a wide object.
        XCTAssertNotNil(jsonError(String(s.dropLast()) + #","0":1}"#))
    }

    // MARK: UTF-8

    func testInvalidUTF8IsFlagged() {
        let bad: [[UInt8]] = [
            [0x80], [0xBF], [0xC0, 0x80], [0xC1, 0xBF], // lone continuation, overlong 2-byte
            [0xE0, 0x80, 0x80], [0xE0, 0x9F, 0xBF], // overlong 3-byte
            [0xF0, 0x80, 0x80, 0x80], [0xF0, 0x8F, 0xBF, 0xBF], // overlong 4-byte
            [0xED, 0xA0, 0x80], [0xED, 0xBF, 0xBF], [0xED, 0xA0, 0xBD, 0xED, 0xB8, 0x80], // surrogates in UTF-8 (CESU)
            [0xF4, 0x90, 0x80, 0x80], [0xF5, 0x80, 0x80, 0x80], [0xF8, 0x88, 0x80, 0x80, 0x80], [0xFF], [0xFE],
            [0xC3], [0xE4, 0xB8], [0xF0, 0x9F, 0x98], // truncated sequences
            [0xC3, 0x41], [0xE4, 0x41, 0x41], [0xF0, 0x9F, 0x41, 0x80], [0xE4, 0xB8, 0xC0], // bad continuation
        ]
        for seq in bad {
            let doc = [0x22] + seq + [0x22]
            let e = jsonError(doc)
            XCTAssertEqual(e?.invalidUTF8, true, "\(seq)")
            XCTAssertFalse(UTF8Validation.isValid(seq), "\(seq)")
            // Also outside strings, in a key, and at the very end of the input.
            XCTAssertEqual(jsonError(bytes(#"{""#) + seq + bytes(#"":1}"#))?.invalidUTF8, true, "\(seq) in key")
            XCTAssertEqual(jsonError(bytes("[1] ") + seq)?.invalidUTF8, true, "\(seq) after value")
        }
    }

    /// The scans skip eight ASCII bytes at a time: what they look for must
    /// be found at every place relative to those steps.
    func testScansFindWhatTheyLookForAtEveryOffset() {
        let a = UInt8(ascii: "a")
        for before in 0...17 {
            let head = [UInt8](repeating: a, count: before), tail = [UInt8](repeating: a, count: 17 - before)
            for seq: [UInt8] in [[0x80], [0xC3], [0xE4, 0xB8], [0xED, 0xA0, 0x80], [0xFF]] {
                XCTAssertFalse(UTF8Validation.isValid(head + seq + tail), "\(seq) after \(before)")
                XCTAssertEqual(jsonError([0x22] + head + seq + tail + [0x22])?.invalidUTF8, true, "\(seq) after \(before)")
            }
            for seq: [UInt8] in [[0xC3, 0xA9], [0xE4, 0xB8, 0xAD], [0xF0, 0x9F, 0x98, 0x80]] {
                XCTAssertTrue(UTF8Validation.isValid(head + seq + tail), "\(seq) after \(before)")
                XCTAssertEqual(try JSONParser.parse([0x22] + head + seq + tail + [0x22]).stringValue.map { Array($0.utf8) },
                               head + seq + tail)
            }
            // In a string: a raw control character is refused, escapes are decoded.
            for c: UInt8 in [0x00, 0x0A, 0x1F] {
                XCTAssertNotNil(jsonError([0x22] + head + [c] + tail + [0x22]), "control \(c) after \(before)")
            }
            let escaped = [0x22] + head + Array(#"\"\\\n"#.utf8) + tail + [0x22]
            XCTAssertEqual(try JSONParser.parse(escaped).stringValue.map { Array($0.utf8) }, head + Array("\"\\\n".utf8) + tail)
            XCTAssertEqual(try JSONParser.parse([0x22] + head + [0x22]).stringValue.map { Array($0.utf8) }, head,
                           "the closing quote after \(before)")
        }
    }

    func testValidUTF8Boundaries() {
        let good: [[UInt8]] = [
            [0x7F], [0xC2, 0x80], [0xDF, 0xBF], [0xE0, 0xA0, 0x80], [0xED, 0x9F, 0xBF], [0xEE, 0x80, 0x80],
            [0xEF, 0xBF, 0xBF], [0xF0, 0x90, 0x80, 0x80], [0xF4, 0x8F, 0xBF, 0xBF],
        ]
        for seq in good {
            XCTAssertTrue(UTF8Validation.isValid(seq), "\(seq)")
            XCTAssertEqual(try JSONParser.parse([0x22] + seq + [0x22]).stringValue.map { Array($0.utf8) }, seq)
        }
        XCTAssertTrue(UTF8Validation.isValid([]))
    }

    func testSyntaxErrorsAreNotFlaggedAsUTF8() {
        XCTAssertEqual(jsonError("[1,]")?.invalidUTF8, false)
        XCTAssertEqual(jsonError("")?.invalidUTF8, false)
    }

    // MARK: encoding

    func testEncoderEscapesQuotesBackslashesAndControlCharacters() {
        XCTAssertEqual(JSON.string("a\"b\\c").encodedString, #""a\"b\\c""#)
        XCTAssertEqual(JSON.string("\n\r\t").encodedString, #""\n\r\t""#)
        XCTAssertEqual(JSON.string("\u{0}\u{1}\u{8}\u{C}\u{1F}").encodedString, #""\u0000\u0001\b\f\u001f""#)
        XCTAssertEqual(JSON.string("é/中😀\u{7F}").encodedString, "\"é/中😀\u{7F}\"")
        // Every control character round-trips and none is emitted raw.
        let all = String(decoding: Array(UInt8(0)..<0x20), as: UTF8.self) + "\"\\"
        let enc = JSON.string(all).encoded
        XCTAssertFalse(enc.dropFirst().dropLast().contains { $0 < 0x20 })
        XCTAssertEqual(try JSONParser.parse(enc), .string(all))
    }

    /// `NotificationDraft` measures no payload whose body is within the
    /// limit: a value's encoding is never longer than the text it was read
    /// from, whatever escapes, spaces and numbers the text has.
    func testAnEncodingIsNeverLongerThanTheTextItWasReadFrom() throws {
        let pieces = [#"\b"#, #"\f"#, #"\n"#, #"\r"#, #"\t"#, #"\""#, #"\\"#, #"\/"#, #"\u0001"#, #"\u001F"#, #"\u00e9"#,
                      #"\ud83d\ude00"#, "é", "x", " ", "\u{7F}"]
        for a in pieces {
            for b in pieces {
                for text in [#"{"\#(a)":"\#(b)"}"#, #"{ "k" : [ "\#(a)\#(b)" , 1.50e+3 , -0 , true , null , { } ] }"#] {
                    XCTAssertLessThanOrEqual(try JSONParser.parse(text).encoded.count, text.utf8.count, text)
                }
            }
        }
    }

    /// The word-at-a-time scan against a byte-at-a-time reference: each
    /// kind of byte at every place relative to the eight-byte steps.
    func testEncoderEscapesEveryByteWhereverItSits() {
        func reference(_ bytes: [UInt8]) -> [UInt8] {
            var out: [UInt8] = [0x22]
            for c in bytes {
                switch c {
                case 0x22: out += [0x5C, 0x22]
                case 0x5C: out += [0x5C, 0x5C]
                case 0x0A: out += Array(#"\n"#.utf8)
                case 0x0D: out += Array(#"\r"#.utf8)
                case 0x09: out += Array(#"\t"#.utf8)
                case ..<0x20: out += Array(String(format: "\\u%04x", c).utf8)
                default: out.append(c)
                }
            }
            return out + [0x22]
        }
        let specials: [UInt8] = [0x00, 0x01, 0x09, 0x0A, 0x0D, 0x1F, 0x20, 0x21, 0x22, 0x23, 0x5B, 0x5C, 0x5D, 0x7F]
        for length in [0, 1, 7, 8, 9, 15, 16, 17, 31] {
            for at in 0..<max(length, 1) {
                for c in specials where length > 0 {
                    var bytes = [UInt8](repeating: UInt8(ascii: "a"), count: length)
                    bytes[at] = c
                    XCTAssertEqual(JSON.string(String(decoding: bytes, as: UTF8.self)).encoded, reference(bytes),
                                   "byte \(c) at \(at) of \(length)")
                }
            }
        }
        // Multi-byte UTF-8 around escapes, and random mixes.
        var rng = SystemRandomNumberGenerator()
        let pieces = ["é", "中", "😀", "\"", "\\", "\n", "\u{1}", "abc", "\u{7F}", " "]
        for _ in 0..<500 {
            let s = (0..<Int.random(in: 0..<40, using: &rng)).map { _ in pieces.randomElement(using: &rng)! }.joined()
            XCTAssertEqual(JSON.string(s).encoded, reference(Array(s.utf8)), s)
        }
    }

    func testEightByteScanFindsEachByteThatNeedsAnEscape() {
        for c in 0...255 {
            let escaped = c < 0x20 || c == 0x22 || c == 0x5C
            for at in 0..<8 {
                var bytes = [UInt8](repeating: UInt8(ascii: "a"), count: 8)
                bytes[at] = UInt8(c)
                let word = bytes.withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) }
                XCTAssertEqual(JSON.anyNeedsEscape(word), escaped, "byte \(c) at \(at)")
            }
        }
        // Neighbours that could borrow into each other: high bytes beside low ones.
        for a in [0x00, 0x1F, 0x20, 0x21, 0x22, 0x5C, 0x80, 0xA2, 0xDC, 0xFF] {
            for b in [0x00, 0x1F, 0x20, 0x21, 0x22, 0x5C, 0x80, 0xA2, 0xDC, 0xFF] {
                let bytes: [UInt8] = [0x61, UInt8(a), UInt8(b), 0x61, 0xFF, 0x80, 0x61, 0x61]
                let word = bytes.withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) }
                let escaped = bytes.contains { $0 < 0x20 || $0 == 0x22 || $0 == 0x5C }
                XCTAssertEqual(JSON.anyNeedsEscape(word), escaped, "\(bytes)")
            }
        }
    }

    func testEncoderEscapesKeys() {
        var o = JSONObject()
        o["a\"\n"] = 1
        XCTAssertEqual(JSON.object(o).encodedString, #"{"a\"\n":1}"#)
        XCTAssertEqual(try JSONParser.parse(JSON.object(o).encoded), .object(o))
    }

    func testEncodeLiteralsAndContainers() {
        let v: JSON = ["a": [1, true, false, nil, "s", [:], []], "b": .int(Int64(-5))]
        XCTAssertEqual(v.encodedString, #"{"a":[1,true,false,null,"s",{},[]],"b":-5}"#)
        XCTAssertEqual(Optional<String>.none.json, .null)
        XCTAssertEqual(Optional("x").json, .string("x"))
    }
}
