#!/bin/sh
# simbridge-sim reads its server from --address only; containers pass it as $SIMBRIDGE_ADDRESS.
# Arguments after the image name go to simbridge-sim (docker run ... simbridge-sim:local --slots 8).
set -eu
exec simbridge-sim --address "${SIMBRIDGE_ADDRESS:-127.0.0.1:50051}" "$@"
