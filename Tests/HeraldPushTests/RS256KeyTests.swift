@testable import HeraldPush
import XCTest

final class RS256KeyTests: XCTestCase {
    func testSignatureVerifiesWithLibcrypto() throws {
        let key = try RS256Key(pem: rsaPKCS8)
        let message = Array("header.claims".utf8)
        let signature = key.sign(message)
        XCTAssertEqual(signature.count, 256)
        XCTAssertTrue(verifySHA256(key: key.key.pointer, message: message, signature: signature))
        XCTAssertFalse(verifySHA256(key: key.key.pointer, message: message + [0], signature: signature))
    }

    func testPKCS1FormIsTheSameKey() throws {
        // PKCS#1 v1.5 signatures are deterministic.
        let message = Array("same".utf8)
        XCTAssertEqual(try RS256Key(pem: rsaPKCS1).sign(message), try RS256Key(pem: rsaPKCS8).sign(message))
    }

    func testRefusesOtherKeysAndShortOnes() {
        for pem in [p256PKCS8, ed25519PKCS8, rsa1024PKCS8, "not a key"] {
            XCTAssertThrowsError(try RS256Key(pem: pem))
        }
    }
}
