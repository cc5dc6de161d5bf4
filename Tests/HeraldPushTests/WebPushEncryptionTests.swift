import HeraldCore
@testable import HeraldPush
import XCTest

final class WebPushEncryptionTests: XCTestCase {
    // RFC 8291 Appendix A.
    static let plaintext = Array("When I grow up, I want to be a watermelon".utf8)
    static let userAgentPrivate = "q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94"
    static let userAgentPublic = b64url("BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4")
    static let auth = b64url("BTBZMqHH6r4Tts7J_aSIgg")
    static let serverPrivate = "yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw"
    static let salt = b64url("DGv6ra1nlYgDCS1FRnbzlw")
    static let body = b64url("DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN")

    /// http_ece, as a browser would, decrypts each body in argv; one hex plaintext a line.
    static let decrypt = """
        import sys, http_ece
        from cryptography.hazmat.primitives.asymmetric import ec
        key = ec.derive_private_key(int(sys.argv[1], 16), ec.SECP256R1())
        for body in sys.argv[3:]:
            print(http_ece.decrypt(bytes.fromhex(body), private_key=key, auth_secret=bytes.fromhex(sys.argv[2]), version="aes128gcm").hex())
        """

    func testReproducesRFC8291AppendixA() throws {
        let serverKey = try P256.privateKey(scalar: b64url(Self.serverPrivate))
        let body = try WebPushEncryption.encrypt(plaintext: Self.plaintext, p256dh: Self.userAgentPublic, auth: Self.auth,
                                                 serverKey: serverKey, salt: Self.salt)
        XCTAssertEqual(Base64URL.encode(body), Base64URL.encode(Self.body))
    }

    func testHKDFMatchesRFC5869TestCase1() {
        let prk = HKDF.extract(salt: [UInt8](hex: "000102030405060708090a0b0c"), ikm: [UInt8](repeating: 0x0b, count: 22))
        XCTAssertEqual(prk.hex, "077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5")
        XCTAssertEqual(HKDF.expand(prk: prk, info: [UInt8](hex: "f0f1f2f3f4f5f6f7f8f9"), length: 42).hex,
                       "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")
    }

    func testHttpEceDecryptsWhatWeEncrypt() throws {
        var generator = SystemRandomNumberGenerator()
        let plaintexts = [0, 1, 100, WebPushEncryption.maxPlaintext].map { n in (0..<n).map { _ in UInt8.random(in: 0...255, using: &generator) } }
        let bodies = try plaintexts.map { try WebPushEncryption.encrypt(plaintext: $0, p256dh: Self.userAgentPublic, auth: Self.auth) }
        XCTAssertEqual(bodies.map(\.count), plaintexts.map { 86 + $0.count + 17 })
        let out = try python(Self.decrypt, [b64url(Self.userAgentPrivate).hex, Self.auth.hex] + bodies.map(\.hex))
        XCTAssertEqual(out, plaintexts.map { $0.hex + "\n" }.joined())
    }

    func testEachMessageHasAFreshKeyAndSalt() throws {
        let a = try WebPushEncryption.encrypt(plaintext: Self.plaintext, p256dh: Self.userAgentPublic, auth: Self.auth)
        let b = try WebPushEncryption.encrypt(plaintext: Self.plaintext, p256dh: Self.userAgentPublic, auth: Self.auth)
        XCTAssertEqual(a.count, b.count)
        XCTAssertNotEqual(a[0..<16], b[0..<16], "salt")
        XCTAssertNotEqual(a[21..<86], b[21..<86], "server key")
        XCTAssertNotEqual(a[86...], b[86...], "ciphertext")
    }

    func testRefusesBadSubscriptionsAndLongMessages() {
        func encrypt(_ plaintext: [UInt8] = Self.plaintext, p256dh: [UInt8] = Self.userAgentPublic, auth: [UInt8] = Self.auth) throws {
            _ = try WebPushEncryption.encrypt(plaintext: plaintext, p256dh: p256dh, auth: auth)
        }
        XCTAssertNoThrow(try encrypt())
        XCTAssertThrowsError(try encrypt([UInt8](repeating: 0x61, count: WebPushEncryption.maxPlaintext + 1)))
        XCTAssertThrowsError(try encrypt(auth: Array(Self.auth.dropLast())))
        XCTAssertThrowsError(try encrypt(auth: Self.auth + [0]))
        var offCurve = Self.userAgentPublic
        offCurve[64] ^= 1
        XCTAssertThrowsError(try encrypt(p256dh: offCurve))
        XCTAssertThrowsError(try encrypt(p256dh: [0x04] + [UInt8](repeating: 0, count: 64)))
        // The compressed form of the same point.
        XCTAssertThrowsError(try encrypt(p256dh: [0x02 | (Self.userAgentPublic[64] & 1)] + Self.userAgentPublic[1..<33]))
        XCTAssertThrowsError(try encrypt(p256dh: []))
    }
}
