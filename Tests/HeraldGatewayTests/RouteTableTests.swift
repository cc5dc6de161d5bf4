import Foundation
import XCTest
@testable import HeraldGateway

/// docs/openapi.yaml names exactly the routes of the route table
/// (`Route.Path.all` and the demo pages): each method and path, with the
/// credential it takes as the operation's `security`.
final class RouteTableTests: XCTestCase {
    static let document = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("docs/openapi.yaml")

    /// `METHOD /path` and its security schemes, for every route of the table.
    static var table: [String: [String]] {
        var routes: [String: [String]] = [:]
        for p in Route.Path.all + Route.Path.demoPages {
            for r in p.routes {
                let schemes: [String] = switch r.credential {
                case .none: []
                case .serverKey: ["serverKey"]
                case .deviceToken(let inQuery): inQuery ? ["deviceToken", "deviceTokenQuery"] : ["deviceToken"]
                }
                XCTAssertNil(routes.updateValue(schemes, forKey: "\(r.method) /\(p.pattern)"), "\(r.method) \(p.pattern) twice")
            }
        }
        return routes
    }

    /// The operations of an OpenAPI document's `paths`, by `METHOD /path`,
    /// and the names of their `security` schemes (none without one, as the
    /// document's top-level `security: []` says): a scan of the document's
    /// layout, two spaces a level, enough for this repository's.
    static func operations(_ yaml: String) -> [String: [String]] {
        var ops: [String: [String]] = [:]
        var inPaths = false, path: String?, op: String?, inSecurity = false
        for line in yaml.split(separator: "\n") {
            if let top = line.wholeMatch(of: /([A-Za-z]\S*):.*/) {
                inPaths = top.1 == "paths"
            } else if !inPaths {
                continue
            } else if let p = line.wholeMatch(of: /[ ]{2}(\/\S*):\s*/) {
                (path, op) = (String(p.1), nil)
            } else if line.wholeMatch(of: /[ ]{4}\S.*/) != nil {
                // An operation, or another key of the path (`parameters`).
                let m = line.wholeMatch(of: /[ ]{4}(get|put|post|delete|patch|head|options|trace):\s*/)
                op = m.flatMap { m in path.map { "\(m.1.uppercased()) \($0)" } }
                if let op { ops[op] = [] }
            } else if line.wholeMatch(of: /[ ]{6}\S.*/) != nil {
                inSecurity = line.wholeMatch(of: /[ ]{6}security:\s*/) != nil
            } else if let op, inSecurity, let s = line.wholeMatch(of: /[ ]{8}- ([A-Za-z]+): \[\]\s*/) {
                ops[op]!.append(String(s.1))
            }
        }
        return ops
    }

    func testTheOpenAPIDocumentNamesExactlyTheTablesRoutes() throws {
        let documented = Self.operations(try String(contentsOf: Self.document, encoding: .utf8))
        let table = Self.table
        XCTAssertEqual(table.count, 36, "the routes of SPEC sections 2-4, 6, 10, 11, 12 and 18, and the demo and admin pages")
        for (route, schemes) in table {
            guard let d = documented[route] else { XCTFail("\(route) is not in docs/openapi.yaml"); continue }
            XCTAssertEqual(d, schemes, "\(route): the document's security, the table's credential")
        }
        for route in documented.keys where table[route] == nil { XCTFail("docs/openapi.yaml names \(route), which the table lacks") }
    }

    /// The scan sees an operation gone, one more, and another credential.
    func testTheScanReadsPathsMethodsAndSecurity() {
        let yaml = """
            openapi: 3.1.0
            paths:
              /a/{id}:
                parameters:
                  - name: id
                get:
                  security: []
                  responses: {}
                patch:
                  security:
                    - deviceToken: []
                    - deviceTokenQuery: []
              /b:
                post:
                  security:
                    - serverKey: []
            components:
              schemas:
                x:
                  get:
            """
        XCTAssertEqual(Self.operations(yaml), ["GET /a/{id}": [], "PATCH /a/{id}": ["deviceToken", "deviceTokenQuery"],
                                                "POST /b": ["serverKey"]])
    }
}
