import XCTest
import Foundation
@testable import HeraldGateway

/// `/metrics` of a worker of `herald serve --workers N`: every worker's.
final class WorkerMetricsTests: XCTestCase {
    func testSamplesAreLabelledWithTheirWorkerAndEachFamilyComesOnce() {
        let one = """
            # HELP herald_connections Open device connections by transport.
            # TYPE herald_connections gauge
            herald_connections{transport="websocket"} 3
            # HELP herald_publishes_total Notifications published.
            # TYPE herald_publishes_total counter
            herald_publishes_total 7

            """
        let two = one.replacingOccurrences(of: "} 3", with: "} 4").replacingOccurrences(of: "total 7", with: "total 9")
        XCTAssertEqual(WorkerMetrics.merge([(1, one), (2, two)]), """
            # HELP herald_connections Open device connections by transport.
            # TYPE herald_connections gauge
            herald_connections{worker="1",transport="websocket"} 3
            herald_connections{worker="2",transport="websocket"} 4
            # HELP herald_publishes_total Notifications published.
            # TYPE herald_publishes_total counter
            herald_publishes_total{worker="1"} 7
            herald_publishes_total{worker="2"} 9

            """)
        XCTAssertEqual(WorkerMetrics.labelled("x{} 1", worker: 3), #"x{worker="3"} 1"#)
    }

    func testTheGatewaysOwnTextMergesWhole() {
        let text = Metrics().prometheusText()
        let merged = WorkerMetrics.merge([(1, text)])
        XCTAssertEqual(merged.split(separator: "\n").count, text.split(separator: "\n").count)
        for line in merged.split(separator: "\n") where !line.hasPrefix("#") {
            XCTAssertTrue(line.contains(#"worker="1""#), String(line))
        }
    }

    func testOtherWorkersAreReadFromTheirFilesAndAStaleOneIsLeftOut() throws {
        let folder = NSTemporaryDirectory() + "herald-metrics-test-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let sample = "# TYPE herald_publishes_total counter\nherald_publishes_total 5\n"
        for i in [1, 2, 3] { FileManager.default.createFile(atPath: "\(folder)/worker-\(i).prom", contents: Data(sample.utf8)) }
        try FileManager.default.setAttributes([.modificationDate: Date().addingTimeInterval(-WorkerMetrics.staleAfter - 1)],
                                              ofItemAtPath: "\(folder)/worker-3.prom")
        let text = WorkerMetrics(folder: folder, index: 1).text(own: "# TYPE herald_publishes_total counter\nherald_publishes_total 6\n")
        XCTAssertEqual(text, """
            # TYPE herald_publishes_total counter
            herald_publishes_total{worker="1"} 6
            herald_publishes_total{worker="2"} 5

            """, "its own live (not its file), worker 2's file, not worker 3's stale one")
    }
}
