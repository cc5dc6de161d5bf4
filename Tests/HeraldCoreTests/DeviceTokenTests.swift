import XCTest
import Foundation
@testable import HeraldCore
@testable import HeraldCrypto

final class DeviceTokenTests: XCTestCase {
    let secret = "s3cret-of-the-app"
    let nowS: Int64 = T0 / 1000
    var now: Millis { T0 }

    func secrets(_ app: String) -> String? {
        switch app {
        case "com.example.todo": return secret
        case "other.app": return "another-secret"
        default: return nil
        }
    }

    func claims(device: String? = "phone-1", iat: Int64? = nil, exp: Int64? = nil, nbf: Int64? = nil) -> DeviceClaims {
        DeviceClaims(app: "com.example.todo", user: "alice", device: device, issuedAt: iat ?? nowS,
                     expiresAt: exp ?? nowS + 3600, notBefore: nbf)
    }

    func verify(_ token: String, at: Millis? = nil) -> Result<DeviceClaims, DeviceToken.Failure> {
        DeviceToken.verify(token, now: at ?? now, secretsFor: { self.secrets($0).map { [TokenSecret(secret: $0)] } }).map(\.claims)
    }

    func assertRefused(_ token: String, at: Millis? = nil, _ why: String = "", file: StaticString = #filePath, line: UInt = #line) {
        if case .success(let c) = verify(token, at: at) { XCTFail("accepted \(why): \(c)", file: file, line: line) }
    }

    func assertAccepted(_ token: String, at: Millis? = nil, _ why: String = "", file: StaticString = #filePath, line: UInt = #line) {
        if case .failure(let f) = verify(token, at: at) { XCTFail("refused \(why): \(f)", file: file, line: line) }
    }

    /// A token with a hand-written header and payload, HS256-signed with `key`.
    func forge(header: String = #"{"alg":"HS256","typ":"JWT"}"#, payload: String, key: String? = nil) -> String {
        let input = Base64URL.encode(bytes(header)) + "." + Base64URL.encode(bytes(payload))
        let sig = HMACSHA256.mac(key: bytes(key ?? secret), message: bytes(input))
        return input + "." + Base64URL.encode(sig)
    }

    var basePayload: String { #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS),"exp":\#(nowS + 3600)}"# }

    // MARK: round trip

    func testSignVerifyRoundTrip() {
        for c in [claims(), claims(device: nil), claims(nbf: nowS - 10)] {
            let t = DeviceToken.sign(c, secret: secret)
            XCTAssertEqual(t.split(separator: ".", omittingEmptySubsequences: false).count, 3)
            XCTAssertEqual(try verify(t).get(), c)
        }
        let c = try! verify(DeviceToken.sign(claims(), secret: secret)).get()
        XCTAssertEqual(c.userKey, UserKey(app: "com.example.todo", user: "alice"))
        XCTAssertEqual(c.device, "phone-1")
    }

    func testSignedTokenIsAStandardHS256JWT() throws {
        let t = DeviceToken.sign(claims(), secret: secret)
        let parts = t.split(separator: ".", omittingEmptySubsequences: false)
        let header = try JSONParser.parse(Base64URL.decode(parts[0])!)
        XCTAssertEqual(header.objectValue?["alg"], "HS256")
        XCTAssertEqual(header.objectValue?["typ"], "JWT")
        let payload = try JSONParser.parse(Base64URL.decode(parts[1])!).objectValue!
        XCTAssertEqual(payload["app"], "com.example.todo")
        XCTAssertEqual(payload["sub"], "alice")
        XCTAssertEqual(payload["dev"], "phone-1")
        XCTAssertEqual(payload["exp"]?.int64Value, nowS + 3600)
        XCTAssertEqual(payload["iat"]?.int64Value, nowS)
        // The signature is HMAC-SHA256 of "header.payload" keyed with the UTF-8 secret.
        let mac = HMACSHA256.mac(key: bytes(secret), message: bytes(parts[0] + "." + parts[1]))
        XCTAssertEqual(Base64URL.decode(parts[2]), mac)
        XCTAssertFalse(t.contains("="))
    }

    func testHandWrittenTokenWithExtraClaimsIsAccepted() {
        let t = forge(payload: #"{"sub":"alice","app":"com.example.todo","exp":\#(nowS + 60),"iat":\#(nowS),"jti":"x","dev":null}"#)
        XCTAssertEqual(try verify(t).get().device, nil)
        assertAccepted(forge(header: #"{"alg":"HS256"}"#, payload: basePayload), "no typ")
    }

    // MARK: forged or malformed

    func testWrongSecretIsRefused() {
        assertRefused(DeviceToken.sign(claims(), secret: "guess"))
        assertRefused(DeviceToken.sign(claims(), secret: ""))
        assertRefused(DeviceToken.sign(claims(), secret: secret + " "))
        // Another app's secret for this app's claims.
        assertRefused(DeviceToken.sign(claims(), secret: "another-secret"))
    }

    func testTokenForAnotherKnownAppVerifiesWithThatAppsSecret() {
        let c = DeviceClaims(app: "other.app", user: "bob", device: nil, issuedAt: nowS, expiresAt: nowS + 60)
        XCTAssertEqual(try verify(DeviceToken.sign(c, secret: "another-secret")).get().app, "other.app")
        assertRefused(DeviceToken.sign(c, secret: secret), "other.app token signed with com.example.todo's secret")
    }

    func testUnknownAppIsRefused() {
        let c = DeviceClaims(app: "nope", user: "alice", device: nil, issuedAt: nowS, expiresAt: nowS + 60)
        assertRefused(DeviceToken.sign(c, secret: secret))
        assertRefused(forge(payload: #"{"sub":"alice","iat":\#(nowS),"exp":\#(nowS + 60)}"#), "no app claim")
        assertRefused(forge(payload: #"{"app":7,"sub":"alice","iat":\#(nowS),"exp":\#(nowS + 60)}"#), "app not a string")
    }

    func testAlgNoneAndOtherAlgorithmsAreRefused() {
        let payload = Base64URL.encode(bytes(basePayload))
        let none = Base64URL.encode(bytes(#"{"alg":"none","typ":"JWT"}"#))
        assertRefused(none + "." + payload + ".", "alg none, empty signature")
        assertRefused(forge(header: #"{"alg":"none","typ":"JWT"}"#, payload: basePayload), "alg none with an HS256 mac")
        assertRefused(forge(header: #"{"alg":"RS256","typ":"JWT"}"#, payload: basePayload), "RS256")
        assertRefused(forge(header: #"{"alg":"HS512","typ":"JWT"}"#, payload: basePayload), "HS512")
        assertRefused(forge(header: #"{"alg":"hs256","typ":"JWT"}"#, payload: basePayload), "lowercase alg")
        assertRefused(forge(header: #"{"typ":"JWT"}"#, payload: basePayload), "no alg")
        assertRefused(forge(header: #"{"alg":["HS256"]}"#, payload: basePayload), "alg array")
        assertRefused(forge(header: #"{"alg":"HS256","typ":"JWE"}"#, payload: basePayload), "typ JWE")
        assertRefused(forge(header: #"{"alg":"HS256","alg":"none"}"#, payload: basePayload), "duplicate alg")
    }

    func testTamperedPayloadIsRefused() {
        let t = DeviceToken.sign(claims(), secret: secret)
        let parts = t.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        let other = DeviceToken.sign(DeviceClaims(app: "com.example.todo", user: "mallory", device: "phone-1",
                                                  issuedAt: nowS, expiresAt: nowS + 3600), secret: "x")
        let otherPayload = String(other.split(separator: ".")[1])
        assertRefused(parts[0] + "." + otherPayload + "." + parts[2], "swapped payload")
        // Flip one character of the payload and of the signature.
        for k in [1, 2] {
            var chars = Array(parts[k])
            let i = chars.count / 2
            chars[i] = chars[i] == "A" ? "B" : "A"
            var p = parts
            p[k] = String(chars)
            assertRefused(p.joined(separator: "."), "part \(k) flipped")
        }
        assertRefused(parts[0] + "." + parts[1] + ".", "no signature")
        assertRefused(parts[0] + "." + parts[1], "two parts")
        assertRefused(t + "." + parts[2], "four parts")
        assertRefused(parts[0] + "." + parts[1] + "." + parts[2] + "=", "padded signature")
        assertRefused(parts[0] + "." + parts[1] + "." + parts[2].dropLast(), "truncated signature")
    }

    func testMalformedTokensAreRefusedWithoutCrashing() {
        for t in ["", ".", "..", "a.b.c", "x", "....", "eyJ.eyJ.sig", String(repeating: "A", count: 9000),
                  String(repeating: "a.", count: 5000), "é.é.é"] {
            assertRefused(t, t.prefix(20).debugDescription)
        }
        // Payload not JSON, or not an object.
        assertRefused(forge(payload: "not json"))
        assertRefused(forge(payload: "[1,2]"))
        assertRefused(forge(payload: #""str""#))
        assertRefused(forge(header: "[]", payload: basePayload))
        // Too long a token even when valid.
        let long = forge(payload: #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS),"exp":\#(nowS + 60),"pad":"\#(String(repeating: "p", count: 7000))"}"#)
        assertRefused(long, "over 8 KiB")
    }

    // MARK: claims

    func testMissingOrNonIntegerExpAndIatAreRefused() {
        let e = nowS + 60
        for p in [
            #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS)}"#,
            #"{"app":"com.example.todo","sub":"alice","exp":\#(e)}"#,
            #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS),"exp":"\#(e)"}"#,
            #"{"app":"com.example.todo","sub":"alice","iat":"\#(nowS)","exp":\#(e)}"#,
            #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS),"exp":\#(e).5}"#,
            #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS).0,"exp":\#(e)}"#,
            #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS),"exp":1e12}"#,
            #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS),"exp":null}"#,
            #"{"app":"com.example.todo","sub":"alice","iat":null,"exp":\#(e)}"#,
            #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS),"exp":true}"#,
            #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS),"exp":99999999999999999999999}"#,
            #"{"app":"com.example.todo","sub":"alice","iat":\#(nowS),"exp":\#(e),"nbf":"0"}"#,
        ] {
            assertRefused(forge(payload: p), p)
        }
    }

    func testExpIsStrict() {
        let t = DeviceToken.sign(claims(exp: nowS + 10), secret: secret)
        assertAccepted(t, at: (nowS + 10) * 1000 - 1, "1 ms before exp")
        assertRefused(t, at: (nowS + 10) * 1000, "now == exp")
        assertRefused(t, at: (nowS + 10) * 1000 + 1, "after exp")
        assertRefused(t, at: (nowS + 20) * 1000, "no leeway on exp")
        assertRefused(DeviceToken.sign(claims(iat: nowS - 100, exp: nowS - 1), secret: secret), "expired a second ago")
    }

    func testIatLeeway() {
        assertAccepted(DeviceToken.sign(claims(iat: nowS + 30), secret: secret), "iat 30 s ahead")
        assertAccepted(DeviceToken.sign(claims(iat: nowS + 30), secret: secret), at: now + 999, "iat 30 s ahead, mid-second")
        assertRefused(DeviceToken.sign(claims(iat: nowS + 31), secret: secret), "iat 31 s ahead")
        assertRefused(DeviceToken.sign(claims(iat: nowS + 3600, exp: nowS + 7200), secret: secret), "iat an hour ahead")
        assertAccepted(DeviceToken.sign(claims(iat: nowS - 86_400), secret: secret), "iat in the past")
    }

    func testNbfLeeway() {
        assertAccepted(DeviceToken.sign(claims(nbf: nowS + 30), secret: secret), "nbf 30 s ahead")
        assertAccepted(DeviceToken.sign(claims(nbf: nowS), secret: secret))
        assertRefused(DeviceToken.sign(claims(nbf: nowS + 31), secret: secret), "nbf 31 s ahead")
        assertRefused(DeviceToken.sign(claims(nbf: nowS + 600), secret: secret), "nbf 10 min ahead")
        let t = DeviceToken.sign(claims(nbf: nowS + 100), secret: secret)
        assertAccepted(t, at: (nowS + 70) * 1000, "once within the leeway")
    }

    func testBadSubAndDevAreRefused() {
        for sub in ["", "a b", "é", String(repeating: "u", count: 129), "a/b"] {
            let c = DeviceClaims(app: "com.example.todo", user: sub, device: nil, issuedAt: nowS, expiresAt: nowS + 60)
            assertRefused(DeviceToken.sign(c, secret: secret), "sub \(sub.debugDescription)")
        }
        for dev in ["", "a b", "é", String(repeating: "d", count: 129)] {
            assertRefused(DeviceToken.sign(claims(device: dev), secret: secret), "dev \(dev.debugDescription)")
        }
        assertRefused(forge(payload: #"{"app":"com.example.todo","iat":\#(nowS),"exp":\#(nowS + 60)}"#), "no sub")
        assertRefused(forge(payload: #"{"app":"com.example.todo","sub":5,"iat":\#(nowS),"exp":\#(nowS + 60)}"#), "sub number")
        assertRefused(forge(payload: #"{"app":"com.example.todo","sub":"alice","dev":5,"iat":\#(nowS),"exp":\#(nowS + 60)}"#),
                      "dev number")
        assertAccepted(DeviceToken.sign(DeviceClaims(app: "com.example.todo", user: String(repeating: "u", count: 128),
                                                     device: String(repeating: "d", count: 128), issuedAt: nowS,
                                                     expiresAt: nowS + 60), secret: secret), "128-character ids")
    }

    // MARK: several secrets (rotation)

    /// An app in the middle of a rotation: the newest secret first.
    let rotating = [TokenSecret(kid: "2026-11", secret: "new-secret"), TokenSecret(kid: "2026-05", secret: "old-secret")]

    func verifyRotating(_ token: String) -> Result<DeviceToken.Verified, DeviceToken.Failure> {
        DeviceToken.verify(token, now: now, secretsFor: { [rotating] in $0 == "com.example.todo" ? rotating : nil })
    }

    func testKidIsInTheSignedHeader() throws {
        let t = DeviceToken.sign(claims(), secret: "new-secret", kid: "2026-11")
        let header = try JSONParser.parse(Base64URL.decode(t.split(separator: ".")[0])!).objectValue!
        XCTAssertEqual(header, ["alg": "HS256", "typ": "JWT", "kid": "2026-11"])
        XCTAssertEqual(try verifyRotating(t).get().claims, claims())
    }

    func testKidChoosesTheSecret() {
        XCTAssertNoThrow(try verifyRotating(DeviceToken.sign(claims(), secret: "new-secret", kid: "2026-11")).get())
        XCTAssertNoThrow(try verifyRotating(DeviceToken.sign(claims(), secret: "old-secret", kid: "2026-05")).get())
        for (secret, kid, why) in [("old-secret", "2026-11", "the other secret's kid"), ("new-secret", "2025-01", "unknown kid"),
                                   ("new-secret", "", "empty kid")] {
            if case .success = verifyRotating(DeviceToken.sign(claims(), secret: secret, kid: kid)) { XCTFail("accepted: \(why)") }
        }
        XCTAssertEqual(verifyRotating(DeviceToken.sign(claims(), secret: "new-secret", kid: "2025-01")),
                       .failure(.invalid("token names an unknown key id (kid)")))
    }

    func testTokenWithoutKidIsCheckedAgainstEverySecret() {
        XCTAssertNoThrow(try verifyRotating(DeviceToken.sign(claims(), secret: "new-secret")).get())
        XCTAssertNoThrow(try verifyRotating(DeviceToken.sign(claims(), secret: "old-secret")).get())
        XCTAssertNoThrow(try verifyRotating(forge(header: #"{"alg":"HS256","kid":null}"#, payload: basePayload, key: "old-secret")).get())
        if case .success = verifyRotating(DeviceToken.sign(claims(), secret: "retired-secret")) { XCTFail("accepted a third secret") }
    }

    func testSingleSecretIgnoresKid() {
        // The form without rotation accepted any header before kids existed.
        assertAccepted(DeviceToken.sign(claims(), secret: secret, kid: "anything"))
        assertRefused(DeviceToken.sign(claims(), secret: "guess", kid: "anything"))
    }

    func testKidThatIsNotAStringIsRefused() {
        for h in [#"{"alg":"HS256","kid":5}"#, #"{"alg":"HS256","kid":["2026-11"]}"#, #"{"alg":"HS256","kid":{}}"#] {
            if case .success = verifyRotating(forge(header: h, payload: basePayload, key: "new-secret")) { XCTFail("accepted \(h)") }
        }
    }

    func testSignatureHoldsWhileItsSecretVerifies() throws {
        let plain = try verifyRotating(DeviceToken.sign(claims(), secret: "old-secret")).get().signature
        XCTAssertTrue(plain.holds(with: rotating))
        XCTAssertTrue(plain.holds(with: [TokenSecret(kid: "renamed", secret: "old-secret")]), "a token without kid: any kid")
        XCTAssertFalse(plain.holds(with: [rotating[0]]), "its secret retired")
        XCTAssertFalse(plain.holds(with: []), "its app removed")
        let named = try verifyRotating(DeviceToken.sign(claims(), secret: "old-secret", kid: "2026-05")).get().signature
        XCTAssertTrue(named.holds(with: rotating))
        XCTAssertFalse(named.holds(with: [rotating[0]]), "its secret retired")
        XCTAssertFalse(named.holds(with: [TokenSecret(kid: "2026-05", secret: "another")]), "its kid now names another secret")
        XCTAssertFalse(named.holds(with: [TokenSecret(kid: "renamed", secret: "old-secret")]), "its kid gone")
        XCTAssertTrue(named.holds(with: [TokenSecret(secret: "old-secret")]), "back to one secret, which ignores kids")
    }

    // MARK: Base64URL, HMAC, constant-time compare

    func testBase64URLRoundTrip() {
        var rng = SystemRandomNumberGenerator()
        for n in 0..<70 {
            let b = (0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) }
            let s = Base64URL.encode(b)
            XCTAssertEqual(s.count, (n * 4 + 2) / 3, "unpadded length")
            XCTAssertFalse(s.contains("=") || s.contains("+") || s.contains("/"))
            XCTAssertEqual(Base64URL.decode(Substring(s)), b)
        }
        XCTAssertEqual(Base64URL.encode(bytes("foobar")), "Zm9vYmFy")
        XCTAssertEqual(Base64URL.encode(bytes("fo")), "Zm8")
        XCTAssertEqual(Base64URL.encode(bytes("f")), "Zg")
        XCTAssertEqual(Base64URL.encode([0xFB, 0xFF, 0xBF]), "-_-_")
        XCTAssertEqual(Base64URL.decode("-_-_"), [0xFB, 0xFF, 0xBF])
        XCTAssertEqual(Base64URL.decode(""), [])
    }

    func testBase64URLDecodeIsStrict() {
        for s in ["Zg==", "Zm8=", "Zg=", "+/+/", "Zm9v YmFy", "Zm9v\n", "Z", "Zm9vY", "Zh", "Zm9", "Zm9vYmE-x",
                  "é", "Zm.v", "Zg%3D", "A===", "AA==", "Zm9=vYmFy"] {
            XCTAssertNil(Base64URL.decode(Substring(s)), s)
        }
        // The last digit of a 2- or 3-digit tail must not carry stray bits.
        XCTAssertEqual(Base64URL.decode("Zg"), bytes("f"))
        XCTAssertNil(Base64URL.decode("Zh"))
        XCTAssertNil(Base64URL.decode("Zv"))
        XCTAssertEqual(Base64URL.decode("Zm8"), bytes("fo"))
        XCTAssertNil(Base64URL.decode("Zm9"))
        XCTAssertNil(Base64URL.decode("Zm_"))
    }

    func testHMACSHA256KnownAnswers() {
        // RFC 4231 test case 2.
        XCTAssertEqual(hex(HMACSHA256.mac(key: bytes("Jefe"), message: bytes("what do ya want for nothing?"))),
                       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        // RFC 4231 test case 1.
        XCTAssertEqual(hex(HMACSHA256.mac(key: Array(repeating: 0x0b, count: 20), message: bytes("Hi There"))),
                       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")
        // Keys longer than the block size (RFC 4231 test case 6).
        XCTAssertEqual(hex(HMACSHA256.mac(key: Array(repeating: 0xaa, count: 131),
                                          message: bytes("Test Using Larger Than Block-Size Key - Hash Key First"))),
                       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
        XCTAssertEqual(hex(HMACSHA256.mac(key: [], message: [])), "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad")
        // A key of exactly the block size is used as it is, one byte more is hashed first.
        let block = Array(repeating: UInt8(0x61), count: 64)
        XCTAssertNotEqual(HMACSHA256.mac(key: block, message: bytes("m")), HMACSHA256.mac(key: block + [0x61], message: bytes("m")))
    }

    func testAKeySetUpOnceGivesTheOneShotMACForEveryMessage() throws {
        // RFC 4231 test cases 2 and 6 (a key longer than the block size).
        let jefe = try XCTUnwrap(HMACSHA256.Key(bytes("Jefe")))
        for _ in 0..<2 {
            XCTAssertEqual(hex(jefe.mac(bytes("what do ya "), bytes("want for nothing?"))),
                           "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        }
        let long = try XCTUnwrap(HMACSHA256.Key(Array(repeating: 0xaa, count: 131)))
        XCTAssertEqual(hex(long.mac(bytes("Test Using Larger Than Block-Size Key - Hash Key First"))),
                       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
        let key = [UInt8](repeating: 3, count: 32), message = [UInt8](repeating: 9, count: 1_000)
        XCTAssertEqual(try XCTUnwrap(HMACSHA256.Key(key)).mac(message), HMACSHA256.mac(key: key, message: message))
    }

    func hex(_ b: [UInt8]) -> String { b.map { String(format: "%02x", $0) }.joined() }

    func testConstantTimeEquals() {
        XCTAssertTrue(constantTimeEquals([], []))
        XCTAssertTrue(constantTimeEquals([1, 2, 3], [1, 2, 3]))
        XCTAssertFalse(constantTimeEquals([1, 2, 3], [1, 2, 4]))
        XCTAssertFalse(constantTimeEquals([0, 2, 3], [1, 2, 3]))
        XCTAssertFalse(constantTimeEquals([1, 2, 3], [1, 2]))
        XCTAssertFalse(constantTimeEquals([1, 2], [1, 2, 3]))
        XCTAssertFalse(constantTimeEquals([], [0]))
        let a = (0..<32).map { UInt8($0) }
        for i in 0..<32 {
            var b = a; b[i] ^= 0x80
            XCTAssertFalse(constantTimeEquals(a, b))
        }
    }
}
