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

    func testWorkersAreReadFromTheirFilesAndAStaleOneIsLeftOut() throws {
        let folder = NSTemporaryDirectory() + "herald-metrics-test-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        func write(_ name: String, _ value: Int) {
            _ = FileManager.default.createFile(atPath: "\(folder)/\(name)",
                                           contents: Data("# TYPE herald_publishes_total counter\nherald_publishes_total \(value)\n".utf8))
        }
        for i in [2, 3] { write("worker-\(i).prom", 5) }
        // Names that read as worker 2 too, and a file being written: not read.
        write("worker-02.prom", 7); write("worker-+2.prom", 7); write("worker-2.prom.tmp", 7)
        try FileManager.default.setAttributes([.modificationDate: Date().addingTimeInterval(-WorkerMetrics.staleAfter - 1)],
                                              ofItemAtPath: "\(folder)/worker-3.prom")
        let metrics = WorkerMetrics(folder: folder, index: 1)
        let own = "# TYPE herald_publishes_total counter\nherald_publishes_total 6\n"
        XCTAssertEqual(metrics.text(own: own), """
            # TYPE herald_publishes_total counter
            herald_publishes_total{worker="1"} 6
            herald_publishes_total{worker="2"} 5

            """, "its own now until its file is written, worker 2's file, not worker 3's stale one")
        write("worker-1.prom", 4)
        XCTAssertTrue(metrics.text(own: own).contains(#"herald_publishes_total{worker="1"} 4"#),
                      "once written, its own file: what another worker would answer for it")
    }
}
