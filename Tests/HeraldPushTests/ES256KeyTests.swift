import CCrypto
import HeraldCore
@testable import HeraldPush
import XCTest

final class ES256KeyTests: XCTestCase {
    func testPKCS8SEC1AndRawScalarGiveTheSameKey() throws {
        let expected = b64url(p256Point)
        for key in [try ES256Key(pem: p256PKCS8), try ES256Key(pem: p256SEC1),
                    try ES256Key(base64URLPrivateKey: p256Scalar), try ES256Key(base64URLPrivateKey: p256Scalar + "\n"),
                    try ES256Key(pemOrRaw: p256SEC1), try ES256Key(pemOrRaw: p256Scalar)] {
            XCTAssertEqual(key.publicKeyRaw, expected)
        }
    }

    func testRefusesWhatIsNotAnUnencryptedP256Key() {
        for pem in [secp256k1PKCS8, p384PKCS8, ed25519PKCS8, rsaPKCS8, encryptedPKCS8, "", "-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----"] {
            XCTAssertThrowsError(try ES256Key(pem: pem))
        }
        let order = "_____wAAAAD__________7zm-q2nF56E87nKwvxjJVE"
        for raw in ["", p256Scalar + "=", String(p256Scalar.dropLast(2)), Base64URL.encode([UInt8](repeating: 0, count: 32)), order, "a b"] {
            XCTAssertThrowsError(try ES256Key(base64URLPrivateKey: raw), raw)
        }
        XCTAssertNoThrow(try ES256Key(base64URLPrivateKey: Base64URL.encode(Array(b64url(order).dropLast()) + [0x50])))
    }

    func testErrorsDoNotRepeatTheKey() {
        let secret = p256Scalar.dropLast(4)
        XCTAssertThrowsError(try ES256Key(base64URLPrivateKey: secret + "!")) { error in
            XCTAssertFalse("\(error)".contains(secret))
        }
        XCTAssertThrowsError(try ES256Key(pem: secp256k1PKCS8)) { error in
            XCTAssertFalse("\(error)".contains("MIGEAgEA"))
        }
    }

    func testSignaturesVerifyWithLibcryptoAgainstThePublicPoint() throws {
        let key = try ES256Key(pem: p256PKCS8)
        let publicOnly = try P256.publicKey(point: key.publicKeyRaw)
        // One signature in 256 has an r under 2^248, which DER writes shorter;
        // likewise s. Sign until both have been seen (about 400 signatures).
        var shortR = false, shortS = false
        for i in 0..<5000 where !(shortR && shortS) {
            let message = Array("message \(i)".utf8)
            let signature = key.sign(message)
            XCTAssertEqual(signature.count, 64)
            shortR = shortR || signature[0] == 0
            shortS = shortS || signature[32] == 0
            let der = derSignature(jose: signature)
            XCTAssertTrue(verifySHA256(key: publicOnly.pointer, message: message, signature: der), "signature \(i)")
            XCTAssertFalse(verifySHA256(key: publicOnly.pointer, message: message + [0], signature: der))
        }
        XCTAssertTrue(shortR && shortS)
    }

    func testDERSignaturesBecomeFixedWidthRAndS() {
        // r = 5, s = 7: one byte each in DER.
        XCTAssertEqual(ES256Key.joseSignature(der: [0x30, 0x06, 0x02, 0x01, 0x05, 0x02, 0x01, 0x07]),
                       [UInt8](repeating: 0, count: 31) + [5] + [UInt8](repeating: 0, count: 31) + [7])
        // r with its high bit set (33 bytes in DER, a leading 0), s of 31 bytes.
        let r = [0x80] + [UInt8](repeating: 0x11, count: 31)
        let s = [UInt8](repeating: 0x22, count: 31)
        let der: [UInt8] = [0x30, 0x44, 0x02, 0x21, 0x00] + r + [0x02, 0x1F] + s
        XCTAssertEqual(ES256Key.joseSignature(der: der), r + [0] + s)
        // An r wider than 32 bytes has no JOSE form; nor has garbage.
        XCTAssertNil(ES256Key.joseSignature(der: [0x30, 0x26, 0x02, 0x21, 0x01] + [UInt8](repeating: 0, count: 32) + [0x02, 0x01, 0x07]))
        XCTAssertNil(ES256Key.joseSignature(der: [0x30, 0x00]))
    }
}
