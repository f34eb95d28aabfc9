# gRPC's official Ruby interop client (Debian's ruby-grpc), plus the one case
# its 1.51 release lacks: special_status_message, as gRPC's interop test
# descriptions define it. Every other case is the official code, unchanged.
#
# Usage: ruby interop_client.rb CLIENT_RB --server_host=H --server_port=P --test_case=C

client_rb = ARGV.shift or abort('usage: interop_client.rb PATH/TO/client.rb FLAGS...')
# Loading defines NamedTests and main; main runs only when client.rb is $0.
require client_rb

class NamedTests
  def special_status_message
    message = "\t\ntest with whitespace\r\nand Unicode BMP \u263A and non-BMP \u{1F608}\t\n"
    req = SimpleRequest.new(
      response_type: :COMPRESSABLE,
      response_size: 1,
      payload: Payload.new(type: :COMPRESSABLE, body: nulls(1)),
      response_status: EchoStatus.new(code: GRPC::Core::StatusCodes::UNKNOWN,
                                      message: message)
    )
    begin
      @stub.unary_call(req)
    rescue GRPC::Unknown => e
      got = e.details.dup.force_encoding(Encoding::UTF_8)
      return if got == message
      fail AssertionError, "Expected message #{message.inspect}. Received: #{got.inspect}"
    rescue Exception => e
      fail AssertionError, "Expected GRPC::Unknown. Received: #{e.inspect}"
    end
    fail AssertionError, 'GRPC::Unknown should have been raised. Was not.'
  end
end

main
