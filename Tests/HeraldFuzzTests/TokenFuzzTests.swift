import XCTest
import HeraldTestSupport
import Synchronization
import HeraldCore
import HeraldCrypto

/// `DeviceToken.verify`, `Base64URL.decode` and `PageToken.decode`.
final class TokenFuzzTests: XCTestCase {

    /// The apps the fuzzer knows, with their secrets: one without kid, or
    /// two with kids (an app mid-rotation). Corpus tokens are signed with these.
    static let secrets: [String: [TokenSecret]] = [
        "demo": [TokenSecret(secret: "fuzz-secret-demo")], "com.example.todo": [TokenSecret(secret: "s3cret-todo")],
        "empty": [TokenSecret(secret: "")],
        "rotating": [TokenSecret(kid: "k2", secret: "s3cret-new"), TokenSecret(kid: "k1", secret: "s3cret-old")],
    ]
    /// 2026-11-22T10:00:00.000Z: a fixed clock, so corpus tokens stay valid.
    static let now: Millis = 1_795_341_600_000
    static let nowS: Int64 = now / 1000

    /// Every token the fuzzer signed with an app's real secret. Anything else
    /// that verifies is a forgery.
    static let signed = Mutex<Set<String>>([])

    static let target = FuzzTarget(
        name: "token",
        extraCorpora: ["base64"],
        dictionary: [".", "..", "eyJ", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9", "eyJhbGciOiJub25lIn0", "=", "+", "/", "-", "_",
                     "A", "AA", "AAA", "AAAA", "Q", "Qg", "QUI", " ", "\n"],
        maxLength: 16384,
        generate: { rng in Array(generateToken(&rng).utf8) },
        check: { bytes in checkToken(String(decoding: bytes, as: UTF8.self)) })

    func testFuzzDeviceTokens() {
        // Corpus tokens signed with one of these secrets (valid ones, and
        // regressions found by the fuzzer) count as signed by the fuzzer.
        for (name, bytes) in Corpus.load("token") {
            let t = String(decoding: bytes, as: UTF8.self)
            if Self.signedWithKnownSecret(t) { Self.signed.withLock { _ = $0.insert(t) } }
            if name.hasPrefix("valid"), case .failure(let f) = DeviceToken.verify(t, now: Self.now, secretsFor: { Self.secrets[$0] }) {
                XCTFail("corpus token \(name) no longer verifies: \(f)")
            }
        }
        FuzzRunner.run(Self.target, test: self)
    }

    static func signedWithKnownSecret(_ token: String) -> Bool {
        let parts = token.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 3, let sig = Base64URL.decode(Substring(String(decoding: parts[2], as: UTF8.self))),
              let (h, p) = claimsFrom(token), let app = p["app"]?.stringValue else { return false }
        let input = Array(token.utf8.prefix(parts[0].count + 1 + parts[1].count))
        return allowedSecrets(app: app, header: h).contains { HMACSHA256.mac(key: Array($0.secret.utf8), message: input) == sig }
    }

    /// The secrets that may sign a token of `app` with this header (SPEC 2
    /// and docs/PROTOCOL.md 3.2, read independently): a `kid` names one of
    /// the app's secrets, unless the app has one secret without kid; no
    /// `kid` (or null), any. A `kid` that is not a string, none.
    static func allowedSecrets(app: String, header h: JSONObject) -> [TokenSecret] {
        let all = secrets[app] ?? []
        guard let k = h["kid"], !k.isNull else { return all }
        guard let kid = k.stringValue else { return [] }
        return all.count == 1 && all[0].kid == nil ? all : all.filter { $0.kid == kid }
    }

    static func claimsFrom(_ token: String) -> (header: JSONObject, payload: JSONObject)? {
        let parts = token.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 3,
              let h = Base64URL.decode(Substring(String(decoding: parts[0], as: UTF8.self))),
              let p = Base64URL.decode(Substring(String(decoding: parts[1], as: UTF8.self))),
              let hj = try? JSONParser.parse(h).objectValue, let pj = try? JSONParser.parse(p).objectValue else { return nil }
        return (hj, pj)
    }

    /// SPEC section 2, read independently. nil: the time claims cannot be
    /// represented in milliseconds (then it must not verify at all).
    static func shouldVerify(_ token: String) -> Bool? {
        guard let (h, p) = claimsFrom(token) else { return false }
        guard h["alg"] == "HS256" else { return false }
        if let typ = h["typ"], typ != "JWT" { return false }
        guard let app = p["app"]?.stringValue, secrets[app] != nil else { return false }
        guard let sub = p["sub"]?.stringValue, Identifiers.isUserId(sub) else { return false }
        guard let exp = p["exp"]?.int64Value, let iat = p["iat"]?.int64Value else { return false }
        if let d = p["dev"], !d.isNull { guard let s = d.stringValue, Identifiers.isUserId(s) else { return false } }
        var nbf: Int64? = nil
        if let n = p["nbf"], !n.isNull { guard let v = n.int64Value else { return false }; nbf = v }
        // Herald's documented range for time claims (docs/SECURITY.md): 1970 to 9999.
        let times: ClosedRange<Int64> = 0...253_402_300_799
        guard times.contains(exp), times.contains(iat) else { return false }
        if let nbf, !times.contains(nbf) { return false }
        guard now < exp * 1000, iat <= nowS + 30 else { return false }
        if let nbf, nbf > nowS + 30 { return false }
        return true
    }

    static func checkToken(_ token: String) -> Outcome {
        let result = DeviceToken.verify(token, now: now, secretsFor: { secrets[$0] })
        let isSigned = signed.withLock { $0.contains(token) }
        switch result {
        case .failure(.invalid(let why)):
            guard !why.isEmpty else { return .failed("refused without a reason") }
            if isSigned, shouldVerify(token) == true { return .failed("a properly signed, valid token is refused: \(why)") }
            return .rejected
        case .success(let v):
            let c = v.claims
            guard isSigned else { return .failed("a token the fuzzer did not sign verifies (forged or mutated): \(token.prefix(400))") }
            guard let expected = shouldVerify(token) else {
                return .failed("verified a token whose exp \(c.expiresAt) overflows when converted to milliseconds "
                    + "(exp &* 1000 wraps in DeviceToken.verify; the gateway then traps on claims.expiresAt * 1000)")
            }
            guard expected else { return .failed("verified a token SPEC section 2 refuses: \(c)") }
            guard let (_, p) = claimsFrom(token), p["app"]?.stringValue == c.app, p["sub"]?.stringValue == c.user,
                  p["exp"]?.int64Value == c.expiresAt, p["iat"]?.int64Value == c.issuedAt,
                  (p["dev"]?.stringValue) == c.device, (p["nbf"]?.int64Value) == c.notBefore else {
                return .failed("claims \(c) differ from the token's payload")
            }
            return .accepted
        }
    }

    static let timeValues: [Int64] = [0, -1, 1, Int64.max, Int64.min, Int64.max / 1000, Int64.max / 1000 + 1,
                                      Int64.min / 1000, Int64.min / 1000 - 1, 18_446_744_073_709_552, 18_446_744_073_709_552 + 2_000_000_000,
                                      -18_446_744_073_709_552 + 2_000_000_000]
    static let offsets: [Int64] = [-10_000_000, -86_400, -31, -30, -29, -1, 0, 1, 29, 30, 31, 60, 3600, 2_592_000, 31_536_000]

    static func generateToken(_ rng: inout SplitMix64) -> String {
        func time(_ rng: inout SplitMix64) -> Int64 {
            rng.oneIn(4) ? rng.pick(timeValues) : nowS + rng.pick(offsets)
        }
        let app = rng.oneIn(12) ? "unknown" : rng.pick(["demo", "com.example.todo", "empty", "rotating"])
        let users = ["alice", "bob", "u-1@example.com", "x:y", String(repeating: "u", count: 128)]
        let user = rng.oneIn(16) ? rng.pick(["", "a b", String(repeating: "u", count: 129), "é"]) : rng.pick(users)
        let device: String? = rng.oneIn(2) ? nil : (rng.oneIn(10) ? "bad device" : rng.pick(["phone-1", "d", "web:1"]))
        let claims = DeviceClaims(app: app, user: user, device: device, issuedAt: time(&rng), expiresAt: time(&rng),
                                  notBefore: rng.oneIn(3) ? time(&rng) : nil)
        let kid: String? = rng.oneIn(2) ? nil : rng.pick(["k1", "k2", "k9", ""])
        let known = secrets[app] ?? []
        let secret = rng.oneIn(8) || known.isEmpty ? TokenSecret(secret: "not-the-secret") : rng.pick(known)
        let t = DeviceToken.sign(claims, secret: secret.secret, kid: kid)
        if allowedSecrets(app: app, header: claimsFrom(t)!.header).contains(secret) { signed.withLock { set in
            if set.count > 200_000 { set.removeAll() }
            set.insert(t)
        } }
        return t
    }

    // MARK: Base64URL

    static let base64 = FuzzTarget(
        name: "base64",
        extraCorpora: ["token", "pagetoken"],
        dictionary: ["A", "Q", "w", "-", "_", "+", "/", "=", "==", " "],
        maxLength: 4096,
        generate: { rng in
            let n = rng.powerLaw(64)
            return Array(Base64URL.encode((0..<n).map { _ in rng.byte() }).utf8)
        },
        check: { bytes in
            // Raw bytes encode and decode back.
            let enc = Base64URL.encode(bytes)
            guard Base64URL.decode(Substring(enc)) == bytes else { return .failed("decode(encode(x)) != x") }
            guard enc.utf8.count == (bytes.count * 8 + 5) / 6 else { return .failed("unpadded length \(enc.utf8.count) for \(bytes.count) bytes") }
            // As text: strict, so every accepted text is the one encoding of its bytes.
            let s = String(decoding: bytes, as: UTF8.self)
            guard let dec = Base64URL.decode(Substring(s)) else { return .rejected }
            guard Base64URL.encode(dec) == s else { return .failed("accepted a non-canonical encoding") }
            return .accepted
        })

    func testFuzzBase64URL() { FuzzRunner.run(Self.base64, test: self) }

    // MARK: PageToken

    static let pageToken = FuzzTarget(
        name: "pagetoken",
        extraCorpora: ["base64"],
        dictionary: ["MT", "Oj", ":", "n_", "A", "_", "-"],
        maxLength: 1024,
        generate: { rng in
            let ms: Int64 = rng.oneIn(4) ? rng.pick(timeValues) : now + Int64(rng.range(-1_000_000, 1_000_000))
            let id = rng.oneIn(3) ? NotificationID.make(now: ms)
                : String(decoding: (0..<rng.range(1, 128)).map { _ in UInt8(rng.range(0x21, 0x7E)) }, as: UTF8.self)
            return Array(PageToken.encode(HistoryKey(createdAt: ms, id: id)).utf8)
        },
        check: { bytes in
            let s = String(decoding: bytes, as: UTF8.self)
            // The input's bytes as a page position: it comes back if the id
            // has the form the gateway gives ids, else the token is refused.
            if (1...128).contains(bytes.count), bytes.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) {
                let k = HistoryKey(createdAt: Int64(bitPattern: fnv1a(bytes)), id: String(decoding: bytes, as: UTF8.self))
                let enc = PageToken.encode(k)
                guard enc.utf8.count <= 256 else { return .failed("page token for a 128-byte id is \(enc.utf8.count) bytes") }
                let wellFormed = NotificationID.isWellFormed(k.id)
                guard (PageToken.decode(enc) == k) == wellFormed else {
                    return .failed(wellFormed ? "decode(encode(\(k))) differs" : "decoded \(k), an id the gateway never gives")
                }
            }
            guard let k = PageToken.decode(s) else { return .rejected }
            guard NotificationID.isWellFormed(k.id) else { return .failed("decoded an id the gateway never gives") }
            guard PageToken.decode(PageToken.encode(k)) == k else { return .failed("decoded key does not survive encode/decode") }
            return .accepted
        })

    func testFuzzPageToken() { FuzzRunner.run(Self.pageToken, test: self) }
}
