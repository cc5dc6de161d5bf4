import Foundation
import HeraldCore

/// Log lines go to stderr (stdout carries only the `listening on` line).
/// Nothing secret is ever passed here: no keys, no token secrets, no tokens.
public enum Log {
    public static func info(_ m: @autoclosure () -> String) { write("info", m()) }
    public static func warning(_ m: @autoclosure () -> String) { write("warning", m()) }
    public static func error(_ m: @autoclosure () -> String) { write("error", m()) }

    static func write(_ level: String, _ m: String) {
        let line = "\(RFC3339.format(WallClock.now())) \(level) \(m)\n"
        FileHandle.standardError.write(line.data(using: .utf8)!)
    }
}
