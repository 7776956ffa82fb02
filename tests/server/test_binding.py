"""A busy address refused in words that fit what holds it (simbridge/server/binding.py)."""
import socket

from simbridge.server.binding import address_in_use, in_use_message


def test_a_port_held_by_a_listening_server_names_the_server():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert address_in_use(address)
        assert "another process is listening on that port" in in_use_message(address)


def test_a_port_held_by_a_connections_local_end_is_not_called_a_server():
    """The kernel gives ports of its ephemeral range (50051 among them) to outgoing connections: a
    trainer started then could not bind, and was told a process listened there when none did."""
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.bind(("127.0.0.1", 0))
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        with accepted:
            port = client.getsockname()[1]
            for address in (f"127.0.0.1:{port}", f"0.0.0.0:{port}"):
                assert address_in_use(address)   # gRPC's bind would fail there too
                message = in_use_message(address)
                assert "listening" not in message, message
                assert "the local end of a connection" in message and "--address HOST:PORT" in message
