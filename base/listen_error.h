// A server that cannot listen on a port it was given because the port is taken. The launcher
// (deploy/launcher/cluster.cc) picks free ports for its children, but a port can still be taken
// between the pick and the child's bind; a child that fails this way exits with
// kExitCannotListen, and the launcher picks new ports and starts it again.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

// EX_TEMPFAIL (sysexits.h): the same command may succeed later, here with other ports.
inline constexpr int kExitCannotListen = 75;

// Unavailable, with a payload that marks it as "the port is taken" (IsPortTaken).
absl::Status PortTakenError(absl::string_view message);
bool IsPortTaken(const absl::Status& status);

}  // namespace tandem
