# gRPC's official Ruby interop server (Debian's ruby-grpc), listening on
# loopback instead of every interface. The server code is the official file,
# read and run as it is, with only its listen address changed.
#
# Usage: ruby interop_server.rb SERVER_RB --port=P

server_rb = ARGV.shift or abort('usage: interop_server.rb PATH/TO/server.rb --port=P')
source = File.read(server_rb)
patched = source.sub('host = "0.0.0.0:#{opts[\'port\']}"', 'host = "127.0.0.1:#{opts[\'port\']}"')
abort("#{server_rb}: listen address not found; cannot keep it on loopback") if patched == source
$stdout.sync = true
# Evaluated under its own path, so its require_relative lines still resolve.
eval(patched, TOPLEVEL_BINDING, server_rb, 1)
