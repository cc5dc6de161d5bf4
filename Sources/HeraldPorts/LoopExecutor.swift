/// Runs `job` on a service loop's thread. `post` is callable from any
/// thread; the transport wakes the loop (lws_cancel_service) to run it.
public protocol LoopExecutor: AnyObject, Sendable {
    func post(_ job: @escaping @Sendable () -> Void)
}
