import Foundation
import HeraldCore
import Synchronization

/// Log lines go to stderr (stdout carries only the `listening on` line), as
/// text (`TIME LEVEL MESSAGE`) or, for log shippers, as one JSON object per
/// line with the same fields (`time`, `level`, `message`).
/// Nothing secret is ever passed here: no keys, no token secrets, no tokens.
public enum Log {
    public enum Format: String, Sendable, CaseIterable { case text, json }

    private static let json = Atomic<Bool>(false)
    /// A worker of `herald serve --workers N` (1...N; 0 when not one):
    /// its lines say which (`worker 2: ...`, JSON `"worker": 2`), since
    /// every worker writes to the supervisor's stderr.
    private static let worker = Atomic<Int>(0)

    /// Set once at start, before any thread logs.
    public static func use(_ f: Format) { json.store(f == .json, ordering: .relaxed) }
    public static func use(worker n: Int) { worker.store(n, ordering: .relaxed) }

    public static func info(_ m: @autoclosure () -> String) { write("info", m()) }
    public static func warning(_ m: @autoclosure () -> String) { write("warning", m()) }
    public static func error(_ m: @autoclosure () -> String) { write("error", m()) }

    static func write(_ level: String, _ m: String) {
        let time = RFC3339.format(WallClock.now())
        let n = worker.load(ordering: .relaxed)
        var line: [UInt8]
        if json.load(ordering: .relaxed) {
            var o: JSONObject = ["time": .string(time), "level": .string(level)]
            if n > 0 { o["worker"] = .int(n) }
            o["message"] = .string(m)
            line = JSON.object(o).encoded
        } else {
            line = Array("\(time) \(level) \(n > 0 ? "worker \(n): " : "")\(m)".utf8)
        }
        line.append(0x0A)
        FileHandle.standardError.write(Data(line))
    }
}
