// The message of whatever a call rejected with, for showing to the user as is.
import { TransportError } from "../transport/types";

export function messageOf(e: unknown): string {
  return TransportError.from(e).message;
}
