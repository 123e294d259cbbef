"""Small Modal apps the emulator tests deploy with the real `modal deploy`."""
