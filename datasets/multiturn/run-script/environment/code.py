print('code:', 20 * 24)
