// forkd's TypeScript client: parent sessions, fork batches whose children share the parent's
// cached context, and their task notifications, over gRPC (@grpc/grpc-js).

export {
  Agent,
  Agents,
  type AgentState,
  type Applied,
  Batch,
  type CallSignal,
  Client,
  type ClientOptions,
  type ContextItem,
  type CreateSessionOptions,
  type Directive,
  type ForkOptions,
  type Limits,
  type Report,
  Session,
  Sessions,
  type Status,
  type TaskNotification,
  type Upload,
} from "./client.js";
export {
  FailedPrecondition,
  ForkdError,
  InvalidArgument,
  NotFound,
  PermissionDenied,
  ResourceExhausted,
  Unauthenticated,
  Unavailable,
} from "./errors.js";
