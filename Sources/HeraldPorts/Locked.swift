import Foundation

/// A value behind a pthread mutex (NSLock). Used instead of
/// Synchronization.Mutex because ThreadSanitizer sees through pthread locks
/// but not through the futex calls Mutex makes, and would report races that
/// are not there.
public final class Locked<Value>: @unchecked Sendable {  // every access holds `lock`
    private let lock = NSLock()
    private var value: Value

    public init(_ value: Value) { self.value = value }

    public func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
