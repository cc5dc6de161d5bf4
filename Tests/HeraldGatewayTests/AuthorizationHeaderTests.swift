import XCTest
import HeraldCore
@testable import HeraldGateway

/// `Authorization: Bearer <credential>` (RFC 9110 11.6.2, RFC 6750 2.1):
/// the scheme in any case, one or more spaces, then the credential; read as
/// bytes, so nothing else passes for it.
final class AuthorizationHeaderTests: XCTestCase {
    func testTheSchemeIsReadInAnyCaseAndTheCredentialAfterItsSpaces() {
        let h = Harness()
        let key = Harness.app.serverKeys[0]
        let cases: [(String, Int)] = [
            ("Bearer \(key)", 200), ("bearer \(key)", 200), ("BEARER \(key)", 200), ("BeArEr   \(key)", 200),
            ("Bearer\t\(key)", 401), ("Bearer\(key)", 401), ("Bearer", 401), ("Bearer ", 401), ("Bearer  ", 401),
            ("Basic \(key)", 401), ("Bearerx \(key)", 401), ("xBearer \(key)", 401), ("Bearer \(key)x", 401),
            ("Béarer \(key)", 401), ("@EARER \(key)", 401), ("bearer " + key.uppercased(), 401),
        ]
        for (value, status) in cases {
            let r = h.request("GET", "/v1/apps/\(Harness.app.id)/users/u1/devices", headers: ["authorization": value])
            h.settle()
            XCTAssertEqual(r.response?.status, status, value.debugDescription)
        }
    }
}
