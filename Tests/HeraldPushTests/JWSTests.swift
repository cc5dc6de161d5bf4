import Foundation
import HeraldCore
@testable import HeraldPush
import XCTest

final class JWSTests: XCTestCase {
    /// PyJWT checks an ES256 token against the public point and prints header and claims.
    static let verifyES256 = """
        import sys, json, jwt
        from cryptography.hazmat.primitives.asymmetric import ec
        key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), bytes.fromhex(sys.argv[1]))
        claims = jwt.decode(sys.argv[2], key, algorithms=["ES256"], audience=sys.argv[3])
        print(json.dumps([jwt.get_unverified_header(sys.argv[2]), claims], sort_keys=True))
        """

    /// PyJWT checks an RS256 token against the public half of the PEM key on stdin.
    static let verifyRS256 = """
        import sys, json, jwt
        from cryptography.hazmat.primitives import serialization
        key = serialization.load_pem_private_key(sys.stdin.buffer.read(), None).public_key()
        claims = jwt.decode(sys.argv[1], key, algorithms=["RS256"], audience=sys.argv[2])
        print(json.dumps([jwt.get_unverified_header(sys.argv[1]), claims], sort_keys=True))
        """

    func now() -> Int64 { Int64(Date().timeIntervalSince1970) }

    func testVAPIDHeaderHasTheRFC8292Shape() throws {
        let vapid = VAPID(key: try ES256Key(pem: p256PKCS8))
        XCTAssertEqual(vapid.publicKey, p256Point)
        let header = vapid.authorization(audience: "https://push.example.net", subject: "mailto:ops@example.com", expiresAt: 1_700_000_000)
        let match = try XCTUnwrap(header.wholeMatch(of: /vapid t=([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+), k=([A-Za-z0-9_-]+)/))
        XCTAssertEqual(b64url(String(match.1)), Array(#"{"typ":"JWT","alg":"ES256"}"#.utf8))
        XCTAssertEqual(b64url(String(match.2)), Array(#"{"aud":"https://push.example.net","exp":1700000000,"sub":"mailto:ops@example.com"}"#.utf8))
        XCTAssertEqual(b64url(String(match.3)).count, 64)
        XCTAssertEqual(String(match.4), p256Point)
    }

    func testVAPIDTokenVerifiesWithPyJWT() throws {
        let key = try ES256Key(base64URLPrivateKey: p256Scalar)
        let exp = now() + 3600
        let header = VAPID(key: key).authorization(audience: "https://fcm.googleapis.com", subject: "mailto:a@b.c", expiresAt: exp)
        let token = String(header.dropFirst("vapid t=".count).prefix { $0 != "," })
        let out = try python(Self.verifyES256, [key.publicKeyRaw.hex, token, "https://fcm.googleapis.com"])
        XCTAssertEqual(out, #"[{"alg": "ES256", "typ": "JWT"}, {"aud": "https://fcm.googleapis.com", "exp": \#(exp), "sub": "mailto:a@b.c"}]"# + "\n")
    }

    func testRS256TokenVerifiesWithPyJWT() throws {
        let exp = now() + 3600
        let claims: JSONObject = ["iss": "svc@example.iam.gserviceaccount.com", "aud": "https://oauth2.googleapis.com/token", "exp": .int(exp)]
        let token = JWS.sign(header: ["typ": "JWT", "kid": "k1"], claims: claims, rs256: try RS256Key(pem: rsaPKCS1))
        let out = try python(Self.verifyRS256, [token, "https://oauth2.googleapis.com/token"], input: Array(rsaPKCS8.utf8))
        XCTAssertEqual(out, #"[{"alg": "RS256", "kid": "k1", "typ": "JWT"}, {"aud": "https://oauth2.googleapis.com/token", "exp": \#(exp), "iss": "svc@example.iam.gserviceaccount.com"}]"# + "\n")
    }

    func testTheKeyDecidesAlg() throws {
        let token = JWS.sign(header: ["alg": "none", "kid": "x"], claims: [:], es256: try ES256Key(pem: p256SEC1))
        let header = try XCTUnwrap(token.split(separator: ".").first)
        XCTAssertEqual(b64url(String(header)), Array(#"{"alg":"ES256","kid":"x"}"#.utf8))
    }
}
