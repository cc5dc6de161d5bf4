import Foundation
import XCTest
@testable import HeraldStores

/// A fresh, empty schema of the test PostgreSQL for one test; its URL
/// (with that schema as `search_path`) opens stores on it. The server is
/// the one `scripts/test-servers` starts (scripts/test always does); without
/// it, the tests that need one skip.
final class PostgresTestDatabase {
    static let urlVariable = "HERALD_TEST_POSTGRES_URL"
    let schema: String
    let url: String
    private let admin: PostgresConnection

    init() throws {
        guard let base = ProcessInfo.processInfo.environment[Self.urlVariable], !base.isEmpty else {
            throw XCTSkip("no test PostgreSQL: set \(Self.urlVariable) (scripts/test-servers starts one; scripts/test always does)")
        }
        schema = "t_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        admin = try PostgresConnection(url: base)
        // The schema name is ours (hex): nothing from outside in the SQL.
        try admin.script("CREATE SCHEMA \(schema)")
        url = base + (base.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(schema)"
    }

    /// Drops the schema and everything in it.
    func drop() {
        _ = try? admin.script("DROP SCHEMA \(schema) CASCADE")
        admin.close()
    }

    /// Runs the test server's control script (`stop` or `start`); skips
    /// when the server was not started by scripts/test-servers.
    static func control(_ action: String) throws {
        guard let ctl = ProcessInfo.processInfo.environment["HERALD_TEST_POSTGRES_CTL"] else {
            throw XCTSkip("HERALD_TEST_POSTGRES_CTL is not set (scripts/test-servers sets it)")
        }
        // Not Foundation's Process: the server pg_ctl leaves running inherits
        // a descriptor by which Process watches for the exit, which then
        // never comes.
        XCTAssertEqual(system("'\(ctl)' \(action)"), 0, "\(ctl) \(action)")
    }
}
