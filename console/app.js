// paygate operator console
